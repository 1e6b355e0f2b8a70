"""GRPO with ``rollout.engine: vllm`` for real: the reward rises, and a SIGKILLed run
restarted at once on the same machine resumes to the same weights as an uninterrupted one.

The restart starts over the killed run's shared memory: vLLM's CPU TP communicator
names its segments the same in every run (``/dev/shm/-tp:0-[0-1]-cpushm_0``) and
creates them exclusively, so the trainer removes the stale ones first
(rollout/stale_shm.py). So does every run after another on the machine: Ray kills
the actors at the end of a run before vLLM unlinks them. (Only on CPUs whose vLLM
kernel build has the SHM communicator, AVX-512; on AVX2 the TP group talks over gloo.)

Every run is the real command line (``python -m grpo_trainer --config``) in its own
process with its own local Ray: 2 FSDP ranks as Ray actors, one vLLM engine sharded
over both (TP 2) or one per rank, vLLM's CPU backend, float32.

Why bit-identical is the right bar: vLLM's seeded sampling is reproducible here. Each
prompt's seed is a function of (rollout.seed, step, dataset index); a restarted run
reloads the engine from the resumed FSDP weights, which equal the uninterrupted run's
bit for bit, and vLLM's CPU kernels compute the same logits for the same batch. So the
same tokens are drawn and the updates match exactly.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task, write_vision_task
from grpo_testkit.vllm_kernels import with_vllm_cpu_kernels
from grpo_trainer.checkpointing.dcp import read_tracker
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.checkpointing.tracker import step_dir_name
from grpo_trainer.rollout.stale_shm import SHM_DIR, VLLM_CPU_SHM

STEPS = 12
pytestmark = pytest.mark.timeout(3000)  # three real runs; vLLM starts in ~1-3 min on 2 cores
RUN_TIMEOUT_S = 1500


@functools.cache
def _vllm_tp_uses_shm() -> bool:
    """Whether vLLM's CPU TP communicator uses shared memory on this CPU: only the kernel
    builds for AVX-512 (`vllm._C`, `vllm._C_AVX512`) have its `init_shm_manager` op;
    with `vllm._C_AVX2` it falls back to torch.distributed (vllm-cpu 0.32.0,
    vllm/distributed/device_communicators/cpu_communicator.py). Asked in a child so
    the test process loads no vLLM kernels."""
    probe = with_vllm_cpu_kernels("print(hasattr(torch.ops._C, 'init_shm_manager'))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    return out[-1] == "True"


def _vllm(cfg: dict[str, Any], tp: int) -> dict[str, Any]:
    cfg["rollout"] = {**cfg["rollout"], "engine": "vllm", "tensor_parallel_size": tp}
    cfg["resources"] = {**cfg["resources"], "num_workers": 2, "cpus_per_worker": 1}
    return cfg


def _start(cfg: dict[str, Any], workdir: Path, name: str) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    # A Ray cluster someone else started on this machine is not ours to join: Ray's
    # ray.init() without an address would (it reads /tmp/ray/ray_current_cluster).
    env["RAY_ADDRESS"] = "local"
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_trainer", "--config", str(path)],
        stdout=(workdir / f"{name}.out").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # one process group: Ray's workers die with a SIGKILL
    )


def _finish(proc: subprocess.Popen[str], workdir: Path, name: str) -> dict[int, dict[str, Any]]:
    rc = proc.wait(timeout=RUN_TIMEOUT_S)
    out = (workdir / f"{name}.out").read_text()
    assert rc == 0, f"{name} exited {rc}:\n{out[-4000:]}"
    return _metrics(out)


def _metrics(out: str) -> dict[int, dict[str, Any]]:
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"step"')]
    return {m["step"]: m for m in lines}


def _stable(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if not k.startswith(("time/", "throughput/", "memory/"))}


def _rises(history: dict[int, dict[str, Any]]) -> tuple[float, float]:
    rewards = [history[s]["reward/mean"] for s in sorted(history)]
    return sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3


@pytest.fixture(scope="module")
def text_run(vllm_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted reference: 12 steps, checkpoints every 4."""
    work = tmp_path_factory.mktemp("vllm-text")
    data = write_text_task(work / "text.jsonl")
    cfg = _vllm(
        text_config(
            vllm_lm,
            data,
            trainer={"total_steps": STEPS},
            checkpoint={"dir": str(work / "ckpt"), "interval_steps": 4, "keep": 4},
        ),
        tp=2,
    )
    history = _finish(_start(cfg, work, "reference"), work, "reference")
    return {"cfg": cfg, "history": history, "ckpt": work / "ckpt", "data": data}


def test_text_reward_rises_with_vllm_tp2(text_run: dict[str, Any]) -> None:
    history = text_run["history"]
    assert sorted(history) == list(range(1, STEPS + 1))
    start, end = _rises(history)
    assert end > start + 0.15, [history[s]["reward/mean"] for s in sorted(history)]
    # vLLM sampled from the actor's current weights every step (float32 on CPU).
    assert all(m["rollout/logprob_abs_diff_mean"] < 1e-4 for m in history.values())


def test_sigkill_and_resume_end_bit_identical(text_run: dict[str, Any], tmp_path: Path) -> None:
    cfg = json.loads(json.dumps(text_run["cfg"]))
    ckpt = tmp_path / "ckpt"
    cfg["checkpoint"]["dir"] = str(ckpt)
    proc = _start(cfg, tmp_path, "killed")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (tracker := read_tracker(ckpt)) is None or tracker.step < 4:
        assert proc.poll() is None, (tmp_path / "killed.out").read_text()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint at step 4"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    killed = _metrics((tmp_path / "killed.out").read_text())
    assert killed and max(killed) < STEPS
    # The killed run's TP segments are still there, under the names the restart's
    # engine is about to create (vLLM alone would fail with EEXIST, errno 17). Its Ray
    # workers (process groups of their own) may map them a moment longer: they exit
    # once they see their raylet gone, long before the restart's engine starts. A CPU
    # whose kernel build has no SHM communicator (AVX2) talks over gloo: no segments,
    # and the restart below proves the resume alone.
    left = [n for n in os.listdir(SHM_DIR) if VLLM_CPU_SHM.search(n)]
    assert bool(left) == _vllm_tp_uses_shm(), f"vLLM segments in {SHM_DIR}: {left}"

    resumed = _finish(_start(cfg, tmp_path, "resumed"), tmp_path, "resumed")
    log = (tmp_path / "resumed.out").read_text()
    first = min(resumed)
    assert "resumed from checkpoint step" in log and first > 1, log[-3000:]
    reference = text_run["history"]
    assert {s: _stable(resumed[s]) for s in resumed} == {s: _stable(reference[s]) for s in resumed}
    last = step_dir_name(STEPS)
    ours, theirs = load_model_tensors(ckpt / last), load_model_tensors(text_run["ckpt"] / last)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_text_reward_rises_with_vllm_lora(vllm_lora_lm: Path, tmp_path: Path) -> None:
    """LoRA with vLLM rollouts (one engine per rank): the base loaded once, the adapter
    sent each step, the reward rises and the engine's log-probs stay the actor's."""
    model = vllm_lora_lm
    data = write_text_task(tmp_path / "text.jsonl")
    cfg = _vllm(
        text_config(
            model,
            data,
            trainer={"total_steps": STEPS},
            actor={"lr": 5e-2, "lora": {"rank": 8, "alpha": 16.0}},
        ),
        tp=1,
    )
    history = _finish(_start(cfg, tmp_path, "lora"), tmp_path, "lora")
    assert sorted(history) == list(range(1, STEPS + 1))
    start, end = _rises(history)
    rewards = [round(history[s]["reward/mean"], 3) for s in sorted(history)]
    print(f"\nLoRA + vLLM rewards: {rewards}")
    assert end > start + 0.15, rewards
    assert all(m["rollout/logprob_abs_diff_mean"] < 1e-4 for m in history.values())


def test_text_and_vlm_learn_in_bf16_with_vllm(
    vllm_lm: Path, vllm_vlm: Path, tmp_path: Path
) -> None:
    """``actor.precision: bf16``: each step's weight sync sends the bf16 weights (widened
    to the engine's float32), so vLLM samples from exactly the actor's policy.

    The VLM run is also the tier's proof that a VLM learns from images with vLLM (one
    engine per rank). A second run, the same in float32, proved that path again and was
    merged into this one: float32 VLM weights reach vLLM exactly (test_engine.py), and a
    float32 VLM's steps with images are the trainer tier's (tests/trainer/test_vlm.py)."""
    text = write_text_task(tmp_path / "text.jsonl")
    vision = write_vision_task(tmp_path / "vision.parquet")
    runs = {
        "bf16-text": _vllm(text_config(vllm_lm, text, actor={"precision": "bf16"}), tp=2),
        "bf16-vlm": _vllm(text_config(vllm_vlm, vision, actor={"precision": "bf16"}), tp=1),
    }
    for name, cfg in runs.items():
        cfg["trainer"] = {**cfg["trainer"], "total_steps": STEPS}
        history = _finish(_start(cfg, tmp_path, name), tmp_path, name)
        assert sorted(history) == list(range(1, STEPS + 1))
        start, end = _rises(history)
        assert end > start + 0.15, (name, [history[s]["reward/mean"] for s in sorted(history)])
        # As in mixed precision: text to float32 rounding, vision a few 1e-3 (placeholders).
        bound = 1e-4 if name == "bf16-text" else 0.05
        assert all(m["rollout/logprob_abs_diff_mean"] < bound for m in history.values()), name
