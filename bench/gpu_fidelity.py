"""GPU fidelity: the planner's GPU memory per stage against what one trainer rank allocates.

For each case the planner plans a one-GPU job on a node of one GPU (this card, this
machine's RAM: ``this_machine``), the operator's renderer turns the plan into the trainer
config, and a fresh process runs a rank's load and two update steps with the trainer's
code (``grpo_testkit.fidelity``): FSDP2 over a world of one (NCCL), the planned
micro-batch with gradient accumulation over the step's samples, the optimizer step. The
Qwen2.5-VL-3B and -7B shapes are built from their published config.json values with
random weights (no download); the samples have the planned prompt and response lengths
and one image of ``maxPixels`` each. Only torch, transformers and pure-Python packages
are needed.

    python bench/gpu_fidelity.py --out results.json            # on a CUDA GPU, < 8 min
    python bench/gpu_fidelity.py --device cpu --shape tiny     # smoke test, seconds

Printed: a table of planned against measured GiB per stage (load, training) and per
component (weights, gradients, optimizer state, reference model, CUDA context, and the
transient rest: activations, logits, gathered units); the rank's host RSS peak and
pinned bytes against the plan's host terms; the update's tokens/s and MFU against the
card's dense bf16 peak (gpu_fidelity_rates.py). On a GPU "measured" is the CUDA
allocator's peak plus the memory outside it (context, NCCL), with the reserved peak
and nvidia-smi's device peak beside it; on a CPU it is the bytes of live tensors at the
same points (a floor: no allocator statistics there). docs/benchmarks.md, "GPU
fidelity", says how to run it on a lent GPU and what to do with the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gpu_fidelity_rates import host_side, rates
from gpu_fidelity_report import GIB, compare, print_report, settings_line


# -- what is measured ---------------------------------------------------------------
def _qwen25_vl(h: int, inter: int, heads: int, layers: int, kv: int, vocab: int, tied: bool,
               vision: dict[str, Any] | None = None, rope: list[int] | None = None,
               ) -> dict[str, Any]:
    """A Qwen2.5-VL config.json in the Hub's layout (the LM's fields at the top level)."""
    tower = vision or {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
    }
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "hidden_act": "silu", "hidden_size": h, "intermediate_size": inter,
        "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv,
        "vocab_size": vocab, "tie_word_embeddings": tied, "attention_dropout": 0.0,
        "initializer_range": 0.02, "max_position_embeddings": 128000, "max_window_layers": 70,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 32768,
        "use_sliding_window": False, "torch_dtype": "bfloat16", "use_cache": True,
        "rope_scaling": {"type": "mrope", "mrope_section": rope or [16, 24, 24]},
        "vision_config": {
            "hidden_act": "silu", "in_chans": 3, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "temporal_patch_size": 2, "tokens_per_second": 2,
            **tower, "out_hidden_size": h,
        },
    }


# The published config.json values (Qwen/Qwen2.5-VL-3B-Instruct, -7B-Instruct); the
# planner reads the same dict, as the operator reads a model's config.json. "tiny" is
# the trainer tier's tiny Qwen2.5-VL layout, for the CPU smoke run.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-vl-3b": _qwen25_vl(2048, 11008, 16, 36, 2, 151936, tied=True),
    "qwen2.5-vl-7b": _qwen25_vl(3584, 18944, 28, 28, 4, 152064, tied=False),
    "tiny": _qwen25_vl(
        64, 128, 4, 2, 2, 448, tied=False, rope=[2, 3, 3],
        vision={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                "window_size": 56, "fullatt_block_indexes": [1]},
    ),
}


@dataclass(frozen=True)
class Geometry:
    """The job's data and batch: EasyR1's lengths for the real shapes; one optimizer
    step per rollout batch (prompts x n = globalBatchSize), several micro-batches."""

    prompt: int
    response: int
    max_pixels: int
    prompts: int = 2
    rollout_n: int = 4
    kl_coef: float = 0.01


GEOMETRY = {
    "qwen2.5-vl-3b": Geometry(2048, 2048, 1003520),
    "qwen2.5-vl-7b": Geometry(2048, 2048, 1003520),
    # The tiny tokenizer spells the chat template in ~120 tokens.
    "tiny": Geometry(160, 16, 3136),
}
# An image-heavy prompt: 4096 tokens, ~3970 of them one image's (1764 x 1764 pixels,
# 28 x 28 per merged token), and a 1024-token response. The update's log-probs used to
# cost (prompt + response) tokens of full logits here, 2.5x what was planned.
IMAGE_HEAVY = Geometry(4096, 1024, 3136000)


@dataclass(frozen=True)
class Case:
    name: str
    shape: str  # a MODEL_CONFIGS key
    precisions: tuple[str, ...]  # the first the planner fits on this card is run
    lora: bool = False
    geometry: Geometry | None = None  # None: the shape's (GEOMETRY)
    # The training side of rollout.placement disaggregated: this GPU trains only (no
    # vLLM share in its plan); the engines' GPUs are another node's.
    train_side: bool = False

    @property
    def lengths(self) -> Geometry:
        return self.geometry or GEOMETRY[self.shape]


CASES = (
    Case("7b-lora-image", "qwen2.5-vl-7b", ("mixed",), lora=True, geometry=IMAGE_HEAVY),
    Case("3b-mixed", "qwen2.5-vl-3b", ("mixed",)),
    Case("3b-bf16", "qwen2.5-vl-3b", ("bf16",)),
    Case("7b-lora", "qwen2.5-vl-7b", ("mixed",), lora=True),
    Case("7b-full", "qwen2.5-vl-7b", ("mixed", "bf16")),
    Case("7b-train-side", "qwen2.5-vl-7b", ("mixed", "bf16"), train_side=True),
    Case("tiny-mixed", "tiny", ("mixed",)),
    Case("tiny-bf16", "tiny", ("bf16",)),
    Case("tiny-lora", "tiny", ("mixed",), lora=True),
)
SHAPE_SETS = {"vl": ("qwen2.5-vl-3b", "qwen2.5-vl-7b"), "tiny": ("tiny",)}


# -- planning (the operator's side) ---------------------------------------------------
@dataclass
class Planned:
    case: Case
    precision: str
    plan: Any  # grpo_operator.planner.Plan
    config: dict[str, Any]  # the trainer config the operator renders for the plan
    env: dict[str, str]


def job_spec(case: Case, precision: str, model_dir: Path, gpu: str, host_gib: int) -> Any:
    from grpo_api.job.spec import GRPOJobSpec

    g = case.lengths
    raw: dict[str, Any] = {
        "model": {"path": str(model_dir)},
        "data": {"train": str(model_dir / "unused.parquet"), "maxPromptLength": g.prompt,
                 "maxResponseLength": g.response, "maxPixels": g.max_pixels},
        "reward": {"type": "math"},
        "algorithm": {"rolloutN": g.rollout_n, "klCoef": g.kl_coef},
        "training": {"rolloutBatchSize": g.prompts, "globalBatchSize": g.prompts * g.rollout_n,
                     "precision": precision},
        "resources": {"gpuType": gpu, "nodes": 1, "gpusPerNode": 1, "hostMemory": f"{host_gib}Gi"},
        "checkpoint": {"size": "1Gi"},
    }
    if case.lora:
        raw["lora"] = {}
    if case.train_side:
        raw["rollout"] = {"placement": "disaggregated",
                          "disaggregated": {"gpuType": gpu, "nodes": 1, "gpusPerNode": 1}}
    return GRPOJobSpec.model_validate(raw)


def this_machine(gpu: str, host_gib: int) -> dict[str, Any]:
    """The catalog the bench plans with: a node of one GPU of that type and this machine's
    RAM. The catalog's nodes have 8 GPUs, and a worker plans within its GPUs' share of
    its node's host memory: one of 8 would get an eighth of the RAM this rank has."""
    from grpo_api.catalog import GPU_CATALOG

    return {gpu: replace(GPU_CATALOG[gpu], gpus_per_node=1, host_memory_gib=host_gib)}


def plan_case(case: Case, gpu: str, host_gib: int, workdir: Path) -> Planned | str:
    """The first of the case's precisions that fits, planned and rendered; or why none."""
    from grpo_operator.planner import InfeasibleError, plan_memory
    from grpo_operator.render.names import JobRef
    from grpo_operator.render.trainer_config import trainer_config

    reasons = []
    for precision in case.precisions:
        spec = job_spec(case, precision, workdir / case.shape, gpu, host_gib)
        try:
            plan = plan_memory(spec, this_machine(gpu, host_gib),
                               model_config=MODEL_CONFIGS[case.shape])
        except InfeasibleError as why:
            reasons.append(f"{precision}: {why.summary}")
            continue
        config = trainer_config(spec, plan, JobRef("gpu-fidelity", "bench", "0"))
        env = {k: v for k, v in plan.env.items() if not k.startswith("RAY_")}
        return Planned(case, precision, plan, config, env)
    return "; ".join(reasons)


# -- children: one fresh process per checkpoint and per case -----------------------------
def _child(fn: str, job: Any, out: str) -> None:
    from grpo_testkit import fidelity

    try:
        value = getattr(fidelity, fn)(*job)
        payload = asdict(value) if hasattr(value, "__dataclass_fields__") else {"value": str(value)}
    except BaseException:
        payload = {"error": {"kind": "error", "message": traceback.format_exc()}}
    Path(out).write_text(json.dumps(payload))


def in_child(fn: str, job: tuple[Any, ...], timeout_s: float) -> dict[str, Any]:
    """``fidelity.<fn>(*job)`` in a forked process (this one has imported torch and
    transformers but never touched CUDA): a fresh CUDA context, allocator and process
    group per case, so one case's peak or failure never leaks into the next."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        proc = mp.get_context("fork").Process(target=_child, args=(fn, job, out))
        proc.start()
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
            return {"error": {"kind": "timeout", "message": f"no result in {timeout_s:.0f} s"}}
        if not os.path.exists(out):
            return {"error": {"kind": "crash", "message": f"exit code {proc.exitcode}"}}
        result: dict[str, Any] = json.loads(Path(out).read_text())
        return result


# -- the run ------------------------------------------------------------------------
def detect_gpu_type() -> str | None:
    """The catalog's GPU type of GPU 0, by nvidia-smi's name (no CUDA call here: this
    process forks the cases, which must start CUDA fresh)."""
    from grpo_api.catalog import GPU_CATALOG

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    res = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader", "--id=0"],
                         capture_output=True, text=True, timeout=30)
    label = res.stdout.strip().replace(" ", "-")
    return next((g.name for g in GPU_CATALOG.values() if g.product_label == label), None)


def default_workdir(needed_bytes: int) -> Path:
    """/dev/shm when it has room for the checkpoint (no disk in the way of the load being
    measured), else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > needed_bytes:
        return shm / "gpu-fidelity"
    return Path(tempfile.gettempdir()) / "gpu-fidelity"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shape", choices=sorted(SHAPE_SETS), default=None,
                   help="vl (3B and 7B; the default on cuda) or tiny (the default on cpu)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: the shape's)")
    p.add_argument("--gpu", default=None, help="catalog GPU type to plan for (default: GPU 0's; "
                   "H100-80GB on cpu)")
    p.add_argument("--host-gib", type=int, default=None, help="host RAM to plan with "
                   "(default: this machine's)")
    p.add_argument("--steps", type=int, default=2, help="update steps per case (>= 2: the "
                   "second has the optimizer state resident, as every later step does)")
    p.add_argument("--workdir", type=Path, default=None, help="random checkpoints go here "
                   "(default: /dev/shm/gpu-fidelity if it has room, else the temp dir)")
    p.add_argument("--budget-s", type=float, default=400.0, help="start no case after this")
    p.add_argument("--case-timeout-s", type=float, default=240.0,
                   help="a checkpoint write or a case still running after this is killed")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the random checkpoints for the next run (default: removed)")
    p.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    return p.parse_args(argv)


def run_cases(args: argparse.Namespace, cases: list[Case], gpu: str, host_gib: int,
              report: dict[str, Any], t0: float) -> None:
    """Plan every case, then write each shape's checkpoint and run its cases, each in a
    fresh process; the report (and --out) grows case by case, so a run cut short by its
    time limit still leaves the cases it finished."""
    from grpo_testkit.fidelity import CaseJob, checkpoint_ready, progress

    # bf16 checkpoints, one shape at a time (each is removed after its last case).
    needed = max(checkpoint_bytes(c.shape) for c in cases)
    workdir = args.workdir or default_workdir(needed)
    if workdir.is_relative_to("/dev/shm"):
        # Checkpoints in /dev/shm are RAM the job cannot have: planned without it (an H100
        # run's 7B offload case was SIGKILLed with 15 GiB of checkpoint there).
        in_ram = sum(checkpoint_bytes(s) for s in {c.shape for c in cases})
        host_gib -= -(-in_ram // int(GIB))
        report["environment"]["host_gib"] = host_gib
    planned = {c.name: plan_case(c, gpu, host_gib, workdir) for c in cases}
    progress(f"planned {len(cases)} cases for {gpu}, {host_gib} GiB host RAM; "
             f"checkpoints in {workdir}", t0)
    written: dict[str, dict[str, Any]] = {}
    for i, case in enumerate(cases):
        p = planned[case.name]
        entry: dict[str, Any] = {"case": case.name}
        report["cases"].append(entry)
        if isinstance(p, str):
            entry["skipped"] = f"the planner fits no precision on this card ({p})"
        else:
            entry |= {"mode": p.plan.geometry.mode(p.plan.settings),
                      "settings": settings_line(p.plan), "planned": p.plan.budget.gpu_stages,
                      "trainer_config": p.config["actor"]}
            if args.budget_s - (time.monotonic() - t0) < 30:
                entry["skipped"] = f"time budget ({args.budget_s:.0f} s) spent"
        if entry.get("skipped") or isinstance(p, str):
            progress(f"{case.name}: skipped, {entry['skipped']}", t0)
            continue
        model_dir = workdir / case.shape
        if case.shape not in written:
            written[case.shape] = {}
            if not checkpoint_ready(model_dir):
                progress(f"writing a random {case.shape} checkpoint to {model_dir}", t0)
                written[case.shape] = in_child("write_random_checkpoint", (
                    MODEL_CONFIGS[case.shape], model_dir, args.device,
                    max(c.lengths.max_pixels for c in cases if c.shape == case.shape)),
                    args.case_timeout_s)
        if written[case.shape].get("error"):
            entry |= {"error": written[case.shape]["error"], "seconds": 0.0}
        else:
            progress(f"{case.name}: {entry['mode']}, {entry['settings']}", t0)
            job = CaseJob(case.name, p.config, p.env, args.device,
                          int(MODEL_CONFIGS[case.shape]["vocab_size"]), args.steps, t0)
            result = in_child("run_case", (job,), args.case_timeout_s)
            if not report["environment"].get("gpu"):
                report["environment"]["gpu"] = result.get("device")
            entry |= {key: result.get(key) for key in
                      ("seconds", "error", "marks", "components", "metrics")}
            if result.get("marks"):
                entry["comparison"] = compare(p.plan, result, args.device == "cuda", args.steps)
                entry |= {"rates": rates(entry, p.plan, gpu, args.steps),
                          "host": host_side(entry, p.plan)}
        if not args.keep_checkpoints and all(c.shape != case.shape for c in cases[i + 1:]):
            shutil.rmtree(model_dir, ignore_errors=True)  # room in /dev/shm for the next
        write_report(args.out, report)
    if not args.keep_checkpoints:  # also those whose last cases were skipped
        for shape in written:
            shutil.rmtree(workdir / shape, ignore_errors=True)


def checkpoint_bytes(shape: str) -> int:
    """A random bf16 checkpoint of the shape on disk, with 10% for its files' overhead."""
    return 2 * plan_parameters(shape) * 11 // 10


def plan_parameters(shape: str) -> int:
    from grpo_operator.planner import shape_from_config

    return shape_from_config(MODEL_CONFIGS[shape]).parameters


def write_report(out: Path | None, report: dict[str, Any]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    # The cases are forked from this process: nothing here may start CUDA. Should an
    # import ask torch.cuda.is_available(), NVML answers without starting it.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import psutil
    import torch
    import transformers

    from grpo_testkit.fidelity import preload

    args = parse_args(argv)
    t0 = time.monotonic()
    preload()  # once here, not in every forked case
    shapes = SHAPE_SETS[args.shape or ("tiny" if args.device == "cpu" else "vl")]
    wanted = [c for c in args.cases.split(",") if c]
    by_name = {c.name: c for c in CASES}
    # In the order named: a device call's time limit may stop the last ones.
    cases = ([by_name[n] for n in wanted if n in by_name] if wanted
             else [c for c in CASES if c.shape in shapes])
    unknown = set(wanted) - {c.name for c in CASES}
    if unknown or not cases:
        print(f"--cases: unknown {sorted(unknown)}; known: {[c.name for c in CASES]}")
        return 2
    gpu = args.gpu or (detect_gpu_type() if args.device == "cuda" else "H100-80GB")
    if gpu is None:
        print("--gpu: nvidia-smi shows no GPU the catalog knows: name one (e.g. --gpu "
              "H100-80GB), or run the CPU smoke test (--device cpu)")
        return 2
    host_gib = args.host_gib or int(psutil.virtual_memory().total // GIB)
    report: dict[str, Any] = {"environment": {
        "device": args.device, "gpu_type": gpu, "host_gib": host_gib,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }, "cases": []}
    run_cases(args, cases, gpu, host_gib, report, t0)
    report["environment"]["seconds"] = time.monotonic() - t0
    write_report(args.out, report)
    print_report(report)
    if args.out:
        print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
