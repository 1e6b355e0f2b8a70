"""Plan equals tensors: what a rank's FSDP2 update really holds is, component by
component, the planner's term for the same model shape and settings (within 2%).

2 spawned gloo ranks run real ``Worker`` updates on the tiny Qwen2.5-VL (images in every
prompt, so the vision tower trains) and the tiny Qwen2, in bfloat16 compute as on GPUs,
one update of 3 micro-batches per rank (gradient accumulation), cut by a token budget
in the shared-prefix layout as the planner plans them, in each mode: mixed (with and
without the KL reference), bf16, LoRA, parameter offload, optimizer offload.
``grpo_testkit.memory_census`` counts the storages of every tensor the update
keeps (FSDP2 parameter shards and gathered copies, sharded and unsharded gradients,
reduce-scatter inputs, optimizer state, the reference model) after each micro-batch's
backward and right after the optimizer step, the planner's peak points, and the largest
sum of FSDP2's transient buffers during the micro-batches. It also measures the live
bytes of the chunked log-prob head in every forward and backward (the planner's
``logits``, chunked here at ``CHUNK`` tokens so that every micro-batch takes several
chunks), every forward's attention mask (``attention_mask``) and one weight sync
after the update (``weight_sync_buffers``). The
planner's side is ``compute_budget`` on a 2-GPU geometry whose shape is read from the
tiny model's config.json, as ``grpo plan`` reads a real model's.

Activations, the CUDA context and vLLM's pool are estimates (``grpo plan`` says so) and
are not compared.

Offload on CPU: the trainer offloads only on CUDA ranks (a CPU rank's memory is host RAM
already; ``modeling.params_home``), so a CPU run cannot show the GPU emptied. What it
checks instead: the planner puts exactly the offloaded terms on the host (0 on the GPU)
and their host bytes per rank are the trainer's tensors that would move (weights,
gradients and reference with ``offloadParams``; the optimizer state with either knob, as
the step runs where the parameters are), each storage in the pinned block torch's host
allocator would make for it where it is pinned (planner/pinned.py: FSDP2's shards and
gradients, the moments moved off the GPU; not the state created in host RAM);
tests/unit/test_params_home.py pins where a CUDA rank puts them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_api.catalog import GPU_CATALOG
from grpo_api.contract import dense_mask_bytes, packed_width, segment_layout_bytes
from grpo_api.job.lora import LoraSpec
from grpo_api.model.shape import shape_from_config
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.modes import FROZEN, GRADS, OPTIMIZER, STATE, WEIGHTS, lora_plan
from grpo_operator.planner.pinned import pinned_block
from grpo_operator.planner.sizes import logprob_bytes, weight_sync_bytes
from grpo_operator.planner.stage_terms import compute_budget
from grpo_operator.planner.types import Budget, Geometry, Settings
from grpo_testkit import memory_census as mc
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import png, write_text_task
from grpo_testkit.dist import run_ranks
from grpo_trainer.model.segment_attention import length_slots

pytestmark = pytest.mark.trainer

WORLD = 2
TOLERANCE = 0.02
LORA_RANK = 4
# One prompt per rank, 6 responses each, micro-batches by tokens (the planner's way),
# the budget the least the planner plans: one whole sample (the prompt and
# RESPONSE_LENGTH tokens), as wide as the trainer pads a row (a multiple of 8,
# grpo_api.contract.packed_width; 72 for both tiny models' prompts). 3 backward passes
# per optimizer step, shared-prefix rows of [8, 1] responses: 9 response tokens each, no
# two such rows within the budget together, each taking 3 chunks.
# Token ids from 10 up: the special tokens (the image pad) are below.
RESPONSES = [[15, 19, 13, 14, 16, 17, 18, 2], [17], [11, 12, 13, 14, 15, 16, 17, 2], [30],
             [40, 41, 42, 43, 44, 45, 46, 2], [50]]
MICRO_BATCHES = 3
CHUNK = 4  # actor.logprob_chunk_tokens: every micro-batch takes 3 chunks
RESPONSE_LENGTH = 8


@dataclass(frozen=True)
class Mode:
    model: str  # "vlm" | "lm"
    actor: dict[str, Any]
    kl: float = 0.01

    @property
    def precision(self) -> str:
        return str(self.actor.get("precision", "mixed"))


MODES = {
    "mixed": Mode("vlm", {}, kl=0.0),
    "mixed_kl": Mode("vlm", {}),
    "bf16_kl": Mode("vlm", {"precision": "bf16"}),
    "lora_kl": Mode("vlm", {"lora": {"rank": LORA_RANK}}),
    "offload_params_kl": Mode("vlm", {"offload_params": True, "offload_optimizer": True}),
    "offload_optimizer_kl": Mode("vlm", {"offload_optimizer": True}),
    "text_mixed_kl": Mode("lm", {}),
}


def _samples(vision: bool) -> list[list[tuple[dict[str, Any], list[int]]]]:
    images = [png((200, 30, 30), (44, 36))] if vision else []
    problem = "<image>How many shapes?" if vision else "Say the number 7 please"
    return [
        [({"index": rank, "problem": problem, "answer": "3", "images": images}, r)
         for r in RESPONSES]
        for rank in range(WORLD)
    ]


def _config(model: Path, data: Path, mode: Mode, prompt: int) -> dict[str, Any]:
    """The mode's trainer config; micro-batches of one whole sample's tokens (``prompt``
    + RESPONSE_LENGTH, as wide as the trainer pads it), the least the planner plans."""
    raw = text_config(
        model,
        data,
        actor={"dtype": "bfloat16", "logprob_chunk_tokens": CHUNK,
               "micro_batch_tokens": packed_width(prompt + RESPONSE_LENGTH), **mode.actor},
        rollout={"n": len(RESPONSES), "max_new_tokens": RESPONSE_LENGTH},
        trainer={"rollout_batch_size": WORLD},
        algorithm={"kl_coef": mode.kl},
    )
    raw["data"]["max_prompt_length"] = prompt
    return raw


@functools.cache
def _prompt_tokens(model: Path, data: Path, vision: bool) -> int:
    """The test's prompt as the ranks encode it."""
    from transformers import AutoConfig

    from grpo_trainer.algorithm.samples import load_rollout_tokens
    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record

    cfg = build_config(_config(model, data, MODES["mixed"], 512), environ={})
    tokens = load_rollout_tokens(cfg, AutoConfig.from_pretrained(model))
    return int(tokens.encoder.encode(Record(**_samples(vision)[0][0][0])).input_ids.numel())


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_task(tmp_path_factory.mktemp("plan-tensors") / "t.jsonl")


@pytest.fixture(scope="module")
def prompts(tiny_vlm: Path, tiny_lm: Path, data: Path) -> dict[str, int]:
    """The prompt's tokens as the ranks encode it, per model."""
    return {"vlm": _prompt_tokens(tiny_vlm, data, True), "lm": _prompt_tokens(tiny_lm, data, False)}


@pytest.fixture(scope="module")
def measured(
    tiny_vlm: Path, tiny_lm: Path, data: Path, prompts: dict[str, int]
) -> dict[str, list[dict[str, Any]]]:
    """Every mode's census on both ranks, from one pair of spawned ranks."""
    models = {"vlm": tiny_vlm, "lm": tiny_lm}
    arg = {
        name: {"config": _config(models[m.model], data, m, prompts[m.model]),
               "samples": _samples(m.model == "vlm")}
        for name, m in MODES.items()
    }
    per_rank = run_ranks(mc.rank_census, WORLD, arg, timeout_s=900)
    return {name: [r[name] for r in per_rank] for name in MODES}


def _budget(model: Path, mode: Mode, prompt: int) -> tuple[Budget, Geometry, Settings]:
    """The planner's budget for the tiny model on 2 GPUs with the mode's settings."""
    shape = shape_from_config(json.loads((model / "config.json").read_text()))
    gpu = GPU_CATALOG["H100-80GB"]
    lora = mode.actor.get("lora")
    geo = Geometry(
        model_path=str(model), shape=shape, shape_source="config.json", gpu=gpu.name,
        gpu_memory_gib=gpu.memory_gib, nodes=1, gpus_per_node=WORLD,
        node_gpus=gpu.gpus_per_node,
        host_memory_gib=gpu.host_memory_gib, cpus_per_node=gpu.cpus,
        product_label=gpu.product_label, sequence_length=prompt + RESPONSE_LENGTH,
        response_length=RESPONSE_LENGTH,
        max_pixels=56 * 56, rollout_batch_size=WORLD, global_batch_size=WORLD * len(RESPONSES),
        kl_coef=mode.kl,
        lora=lora_plan(shape, LoraSpec(rank=lora["rank"])) if lora else None,
        rollout_engine="vllm", logprob_chunk_tokens=CHUNK,
    )
    st = Settings(
        rank0_init=True, offload_params=bool(mode.actor.get("offload_params")),
        offload_optimizer=bool(mode.actor.get("offload_optimizer")),
        gradient_checkpointing=False, micro_batch_size=1,
        rollout_gpu_memory_utilization=0.5, rollout_n=len(RESPONSES), ray_object_store_gib=2.0,
        precision=mode.precision, micro_batch_tokens=packed_width(prompt + RESPONSE_LENGTH),
    )
    return compute_budget(geo, st), geo, st


def _planned(budget: Budget, geo: Geometry, st: Settings) -> dict[str, float]:
    """The planner's bytes per rank for each census component; offloaded terms are
    read from the host side (per node / ranks per node) where the GPU side says 0."""
    train = budget.gpu_stages["training"]
    terms = STATE[geo.mode(st)]
    ranks = geo.ranks_per_node

    def kind(k: str) -> float:
        return sum(train[t.name] for t in terms if t.kind == k) * GIB

    host = budget.host_terms
    out = {
        mc.WEIGHTS: kind(WEIGHTS), mc.FROZEN: kind(FROZEN), mc.GRADS: kind(GRADS),
        mc.OPTIMIZER: kind(OPTIMIZER), mc.REFERENCE: train["reference_model_shard"] * GIB,
        "host_params_grads_ref": host["offloaded_params_and_grads"] / ranks * GIB,
        "host_optimizer": host["offloaded_optimizer"] / ranks * GIB,
        "fsdp_layer_buffers": train["fsdp_layer_buffers"] * GIB,
        "fsdp_root_buffers": budget.gpu_stages["training_root"]["fsdp_root_buffers"] * GIB,
    }
    return out


def _close(measured: float, planned: float) -> bool:
    return measured == planned == 0 or abs(measured - planned) <= TOLERANCE * planned


def _pinned(c: dict[str, Any], *components: str) -> int:
    """What the components' tensors take as pinned host blocks on a GPU node, each its
    own block (torch's host allocator, as planner/pinned.py models it): the host terms
    are planned so."""
    return sum(pinned_block(n) for k in components for n in c[mc.BLOCKS][k])


def _held(c: dict[str, Any]) -> dict[str, int]:
    """A census as the planner's components: gradients sharded and unsharded together."""
    return {
        mc.WEIGHTS: c[mc.WEIGHTS], mc.FROZEN: c[mc.FROZEN],
        mc.GRADS: c[mc.GRADS] + c[mc.GRADS_UNSHARDED], mc.OPTIMIZER: c[mc.OPTIMIZER],
        mc.REFERENCE: c[mc.REFERENCE],
        # FSDP2's buffers are a transient of the micro-batch: none may outlive it.
        "buffers_at_rest": c[mc.GATHERED] + c[mc.REDUCE_BUFFERS],
    }


@pytest.mark.parametrize("name", list(MODES))
def test_each_component_the_trainer_holds_is_the_planners_term(
    measured: dict[str, list[dict[str, Any]]], tiny_vlm: Path, tiny_lm: Path, name: str,
    prompts: dict[str, int],
) -> None:
    mode = MODES[name]
    model = tiny_vlm if mode.model == "vlm" else tiny_lm
    budget, geo, st = _budget(model, mode, prompts[mode.model])
    plan = _planned(budget, geo, st)
    offload_params, offload_opt = st.offload_params, st.offload_optimizer or st.offload_params
    bad: list[str] = []
    for rank, r in enumerate(measured[name]):
        points = [(f"micro-batch {i} backward", c) for i, c in enumerate(r["micro"])]
        points += [("optimizer step", c) for c in r["step"]]
        assert len(r["micro"]) == MICRO_BATCHES and len(r["step"]) == 1
        for where, census in points:
            held = _held(census)
            want = {
                mc.WEIGHTS: 0.0 if offload_params else plan[mc.WEIGHTS],
                mc.FROZEN: 0.0 if offload_params else plan[mc.FROZEN],
                mc.GRADS: 0.0 if offload_params else plan[mc.GRADS],
                mc.REFERENCE: 0.0 if offload_params else plan[mc.REFERENCE],
                "buffers_at_rest": 0.0,
            }
            if offload_params:  # the GPU side is 0; the host holds these, pinned
                want["host_params_grads_ref"] = plan["host_params_grads_ref"]
                held["host_params_grads_ref"] = _pinned(
                    census, mc.WEIGHTS, mc.FROZEN, mc.GRADS, mc.GRADS_UNSHARDED, mc.REFERENCE)
                for k in (mc.WEIGHTS, mc.FROZEN, mc.GRADS, mc.REFERENCE):
                    want.pop(k)
                    held.pop(k)
            if where == "optimizer step":  # the state exists from the first step on
                key = "host_optimizer" if offload_opt else mc.OPTIMIZER
                want[key] = plan[key]
                held[key] = held.pop(mc.OPTIMIZER)
                if offload_opt and not offload_params:  # moved off the GPU: pinned
                    held[key] = _pinned(census, mc.OPTIMIZER)
                if offload_opt:
                    assert plan[mc.OPTIMIZER] == 0, "offloaded optimizer left on the GPU"
            for k, planned in want.items():
                if not _close(held[k], planned):
                    bad.append(f"rank {rank}, {where}: {k} measured {held[k]} B, "
                               f"planned {planned:.0f} B")
        for part, term in (("layers", "fsdp_layer_buffers"), ("root", "fsdp_root_buffers")):
            peak = r["peak"][part]
            if not _close(peak, plan[term]):
                bad.append(f"rank {rank}: FSDP2 buffers while the {part} run: peak {peak} B, "
                           f"planned {plan[term]:.0f} B")
    if offload_params:
        assert plan[mc.WEIGHTS] == plan[mc.GRADS] == plan[mc.REFERENCE] == 0
    assert not bad, "\n".join(bad)


def test_the_planners_parameter_count_is_the_models(
    tiny_vlm: Path, tiny_lm: Path
) -> None:
    """Every term above is bytes per parameter times this count: config.json's reading
    (vision tower included) must be the model's own."""
    from grpo_api.trainer_config import ModelConfig
    from grpo_trainer.model.modeling import load_full

    for model in (tiny_vlm, tiny_lm):
        shape = shape_from_config(json.loads((model / "config.json").read_text()))
        real = load_full(ModelConfig(path=str(model)), torch.float32)
        assert shape.parameters == sum(p.numel() for p in real.parameters())
        vision = sum(p.numel() for n, p in real.named_parameters() if ".visual." in n)
        assert shape.vision_parameters == vision


@pytest.mark.parametrize("name", [n for n, m in MODES.items() if m.kl and "lora" not in n])
def test_the_reference_in_the_compute_dtype_gives_the_policys_log_probs_exactly(
    measured: dict[str, list[dict[str, Any]]], name: str
) -> None:
    """The reference model is stored in bf16 (the compute dtype) instead of float32: the
    weights it computes with are the same bf16 values FSDP2 gathered from float32 before
    (round to nearest either way), so before the first optimizer step its log-probs are
    the policy's to the bit and the KL of the whole update is exactly 0."""
    for r in measured[name]:
        assert r["metrics"]["actor/kl"] == 0.0


@pytest.mark.parametrize("name", list(MODES))
def test_the_log_prob_head_and_the_weight_sync_hold_the_planners_terms(
    measured: dict[str, list[dict[str, Any]]], tiny_vlm: Path, tiny_lm: Path, name: str,
    prompts: dict[str, int],
) -> None:
    """The chunked head's bytes, at every call, are ``logprob_bytes`` for its response
    tokens and chunk (its backward, the peak, within the tolerance; its forward below),
    and the plan's ``logits`` term is that formula at the most response tokens the token
    budget admits (the budget, or the rank's responses at their longest, the fewer) and
    holds every call. One weight sync holds ``weight_sync_bytes`` beside the state,
    on the GPU or, with offloaded parameters, in host RAM (the plan counts it there
    beyond the gradients the update freed)."""
    mode = MODES[name]
    budget, geo, st = _budget(tiny_vlm if mode.model == "vlm" else tiny_lm, mode,
                              prompts[mode.model])
    compute_b = 2  # actor.dtype bfloat16, as on GPUs
    most = min(st.micro_batch_tokens, len(RESPONSES) * RESPONSE_LENGTH)
    trained_head = geo.lora is None  # LoRA never adapts the head
    worst = logprob_bytes(geo.shape, compute_b, CHUNK, most, trained_head=trained_head)
    assert budget.gpu_stages["training"]["logits"] * GIB == pytest.approx(worst)
    sync = weight_sync_bytes(geo)
    on_gpu = budget.gpu_stages["weight_sync"]["weight_sync_buffers"] * GIB
    on_host = budget.host_terms["weight_sync_buffers"] / geo.ranks_per_node * GIB
    if st.offload_params:  # in host RAM, beyond the offloaded gradient shard it follows
        grads = sum(t.bytes_per_param for t in STATE[geo.mode(st)] if t.kind == GRADS)
        freed = grads * geo.shape.parameters / geo.world_size
        assert (on_host, on_gpu) == (pytest.approx(max(0.0, sync - freed)), 0)
    else:
        assert (on_host, on_gpu) == (0, pytest.approx(sync))
    bad: list[str] = []
    for rank, r in enumerate(measured[name]):
        calls = r["head"]
        # Every micro-batch's forward and backward (and the reference's forwards) went
        # through the head, in several chunks each.
        assert sum(c["pass"] == "backward" for c in calls) == MICRO_BATCHES
        assert all(c["chunk"] == CHUNK < c["tokens"] for c in calls)
        for c in calls:
            planned = logprob_bytes(geo.shape, compute_b, c["chunk"], c["tokens"],
                                    trained_head=trained_head)
            peak = c["pass"] == "backward"
            if c["bytes"] > min(planned, worst) or (peak and not _close(c["bytes"], planned)):
                bad.append(f"rank {rank}: head {c['pass']} of {c['tokens']} tokens held "
                           f"{c['bytes']} B, planned {planned:.0f} B")
        if not (r["sync"] <= sync and _close(r["sync"], sync)):
            bad.append(f"rank {rank}: weight sync held {r['sync']} B, planned {sync:.0f} B")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", list(MODES))
def test_the_attention_layout_is_the_planners_term(
    measured: dict[str, list[dict[str, Any]]], tiny_vlm: Path, tiny_lm: Path, name: str,
    prompts: dict[str, int],
) -> None:
    """Every forward's attention layout (the segment layout's mask, gathers and segment
    ids, in the compute dtype, or the dense 4-D mask where that is smaller) is what
    grpo_api.contract counts for its rows and responses, and within the plan's
    ``attention_mask`` term: the lesser of the two layouts' worst cases, the dense
    budget^2 here (one row as wide as the budget; the segment layout's worst, the rank's
    6 responses in slots of 8, is larger). The trainer's rows of [8, 1] responses take
    the segments, a slot group each, under 0.4x the dense mask."""
    mode = MODES[name]
    budget, _, st = _budget(tiny_vlm if mode.model == "vlm" else tiny_lm, mode,
                            prompts[mode.model])
    planned = budget.gpu_stages["training"]["attention_mask"] * GIB
    dense_worst = dense_mask_bytes(1, st.micro_batch_tokens, 2)
    assert planned == dense_worst < segment_layout_bytes(
        st.micro_batch_tokens, [(len(RESPONSES), RESPONSE_LENGTH)],
        len(RESPONSES) * RESPONSE_LENGTH, prompts[mode.model], 2)
    for r in measured[name]:
        # The update's 3 micro-batches, with the old log-probs on-policy; the reference's
        # pass over the same cut with KL.
        assert len(r["masks"]) == MICRO_BATCHES * (2 if mode.kl else 1)
        for m in r["masks"]:
            rows, width, size = len(m["prompts"]), m["width"], m["dtype_bytes"]
            dense = dense_mask_bytes(rows, width, size)
            # The responses of 8 and 1 tokens take a slot group each (length_slots).
            slots = length_slots(m["responses"])
            assert slots == [(1, 8), (1, 1)]
            by_segment = segment_layout_bytes(rows * width, slots, sum(m["responses"]),
                                              max(m["prompts"]), size)
            assert m["segments"] and m["bytes"] == by_segment < 0.4 * dense, m
            assert m["bytes"] <= planned
