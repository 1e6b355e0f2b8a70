"""Training modes (mixed, bf16, LoRA): EasyR1's hardware table, per-mode state, refusals
that name the cheapest mode that fits, the API fields and their rendering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from grpo_api.job import SpecError, parse_spec
from grpo_api.job.lora import LoraSpec
from grpo_api.model.shape import KNOWN_MODELS, shape_from_config
from grpo_api.trainer_config import Config
from grpo_operator.planner import InfeasibleError, plan_memory, plan_status
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.modes import lora_plan
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_operator.webhook import admission_problem

pytestmark = pytest.mark.unit

EASYR1 = "EasyR1 README, Hardware Requirements (GRPO, estimated)"
MODELS = {  # the table's sizes: Qwen2.5 (1.5B exists only as a text model) and Qwen2.5-VL
    "1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "3B": "Qwen/Qwen2.5-VL-3B-Instruct",
    "7B": "Qwen/Qwen2.5-VL-7B-Instruct",
    "32B": "Qwen/Qwen2.5-VL-32B-Instruct",
    "72B": "Qwen/Qwen2.5-VL-72B-Instruct",
}


@dataclass(frozen=True)
class Cell:
    row: str  # the table's row: AMP (mixed), BF16, LoRA
    size: str
    gpu: str  # the catalog type of the table's "N*xxGB"
    gpus: int
    source: str
    # What the planner must offload to fit (EasyR1's own defaults offload both params and
    # optimizer): "" none, "optimizer", "params" (and the optimizer with them). Cells
    # where the mode holds everything on the GPU are the ones mixed precision cannot
    # hold there.
    offload: str = ""
    # False: the planner refuses the cell.
    fits: bool = True

    @property
    def id(self) -> str:
        return f"{self.row}-{self.size}-{self.gpus}x{self.gpu}"


# The update's log-probs hold one chunk of float32 logits (planner/budget.py
# logprob_bytes: 0.6 GiB at the default 512 tokens over Qwen's 152k vocabulary, where the
# full float32 logits of one 2048-token response were 8.7 GiB, measured on an H100 at 30 B
# per response token per vocabulary entry): no AMP cell offloads now. The three that did
# (1.5B, 7B, 72B) moved their Adam moments to host RAM for those logits alone.
AMP = [
    Cell("AMP", "1.5B", "L4-24GB", 2, f"{EASYR1}: 2*24GB"),
    Cell("AMP", "3B", "A100-40GB", 4, f"{EASYR1}: 4*40GB"),
    Cell("AMP", "7B", "A100-40GB", 8, f"{EASYR1}: 8*40GB"),
    Cell("AMP", "32B", "H100-80GB", 16, f"{EASYR1}: 16*80GB"),
    Cell("AMP", "72B", "H100-80GB", 32, f"{EASYR1}: 32*80GB"),
]
# bf16 at 10 B/param (Kahan compensation included) does not hold 1.5B on one 24 GB L4
# with the optimizer state: 14.3 GiB of state, the 2.9 GiB reference and the context
# leave less than the margin beside the training's activations; with the Adam moments
# and compensation in host RAM it fits, and its optimizer step (the state back on the
# GPU) too. 3B on one A100-40GB holds neither its state (34.9 GiB) nor the step there,
# so its parameters go to host RAM as well. 7B on four A100s no longer offloads: its
# optimizer state went to host RAM for the full logits alone. EasyR1 also keeps the
# reference model in host RAM, which this planner does not.
# The 72B cells hold what FSDP2 really gathers and reduces (planner/fsdp.py: the 2.5B-
# parameter root, embeddings and LM head, stays gathered through every layer): bf16 on
# 16 H100s peaks above the usable memory in training with everything on the GPU, so the
# optimizer state goes to host RAM; LoRA on 4 keeps a 34 GiB frozen base shard beside
# vLLM's 34 GiB TP-4 weights, which leaves less than the margin for the KV cache, so the
# base goes too. LoRA 1.5B on a 12 GB card and 3B on a 24 GB L4 fit without offload now:
# the full logits (8.7 GiB) were what refused the one and offloaded the other.
BF16 = [
    Cell("BF16", "1.5B", "L4-24GB", 1, f"{EASYR1}: 1*24GB", offload="optimizer"),
    Cell("BF16", "3B", "A100-40GB", 1, f"{EASYR1}: 1*40GB", offload="params"),
    Cell("BF16", "7B", "A100-40GB", 4, f"{EASYR1}: 4*40GB"),
    Cell("BF16", "32B", "H100-80GB", 8, f"{EASYR1}: 8*80GB"),
    Cell("BF16", "72B", "H100-80GB", 16, f"{EASYR1}: 16*80GB", offload="optimizer"),
]
LORA = [
    Cell("LoRA", "1.5B", "RTX3060-12GB", 1, f"{EASYR1}: 1*12GB"),
    Cell("LoRA", "3B", "L4-24GB", 1, f"{EASYR1}: 1*24GB"),
    Cell("LoRA", "7B", "RTX5090-32GB", 2, f"{EASYR1}: 2*32GB"),
    Cell("LoRA", "32B", "H100-80GB", 2, f"{EASYR1}: 2*80GB"),
    Cell("LoRA", "72B", "H100-80GB", 4, f"{EASYR1}: 4*80GB", offload="params"),
]


def easyr1_job(cell: Cell, mode: str | None = None, **memory: Any) -> dict[str, Any]:
    """The cell as a GRPOJob with EasyR1's examples/config.yaml geometry: 2048 + 2048
    tokens, images up to 4194304 pixels, 5 responses per prompt, 512 prompts per step,
    128 per update, KL 0.01."""
    per_node = min(cell.gpus, 8)
    mode = mode or {"AMP": "mixed", "BF16": "bf16", "LoRA": "lora"}[cell.row]
    return {
        "model": {"path": MODELS[cell.size]},
        "data": {"train": "hiyouga/geometry3k@train", "maxPromptLength": 2048,
                 "maxResponseLength": 2048, "maxPixels": 4194304},
        "algorithm": {"rolloutN": 5, "klCoef": 0.01},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 128,
                     "precision": "bf16" if mode == "bf16" else "mixed"},
        **({"lora": {}} if mode == "lora" else {}),
        "resources": {"gpuType": cell.gpu, "nodes": cell.gpus // per_node, "gpusPerNode": per_node},
        "checkpoint": {"size": "1Ti"},
        "memory": memory,
    }


@pytest.mark.parametrize("cell", AMP, ids=lambda c: c.id)
def test_easyr1_amp_row_plans_in_mixed_precision(cell: Cell) -> None:
    plan = plan_memory(parse_spec(easyr1_job(cell)))
    assert plan_status(plan).mode == "mixed", cell.source
    assert plan.settings.offload_optimizer == bool(cell.offload), cell.source
    assert not plan.settings.offload_params, cell.source


@pytest.mark.parametrize("cell", [c for c in BF16 + LORA if c.fits], ids=lambda c: c.id)
def test_easyr1_bf16_and_lora_rows_plan_feasible(cell: Cell) -> None:
    plan = plan_memory(parse_spec(easyr1_job(cell)))
    assert plan.budget.fits, cell.source
    assert plan.world_size == cell.gpus
    assert plan_status(plan).mode == {"BF16": "bf16", "LoRA": "lora"}[cell.row]
    assert plan.settings.offload_optimizer == bool(cell.offload), cell.source
    assert plan.settings.offload_params == (cell.offload == "params"), cell.source


@pytest.mark.parametrize("cell", [c for c in BF16 + LORA if not c.offload and c.fits],
                         ids=lambda c: c.id)
def test_mixed_cannot_hold_those_cells_on_the_gpu_and_its_refusal_names_the_mode(
    cell: Cell,
) -> None:
    """With the state on the GPU (offload pinned off), the mode fits and mixed precision
    does not; mixed's refusal names the mode, with the GPUs the job already has."""
    no_offload = {"offloadParams": False, "offloadOptimizer": False}
    assert plan_memory(parse_spec(easyr1_job(cell, **no_offload))).budget.fits
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(easyr1_job(cell, "mixed", **no_offload)))
    text = str(err.value)
    assert "in mixed precision does not fit" in text
    name = "bf16 training" if cell.row == "BF16" else "LoRA"
    assert f"{name} fits on your {cell.gpus} GPUs (training peak" in text, text
    assert "offloading" not in text  # the mode holds everything on the GPU
    fix = "spec.training.precision: bf16" if cell.row == "BF16" else "spec.lora"
    assert fix in text


# LoRA cells that use part of their node's GPUs: a worker plans within that share of the
# node's host memory, too little for mixed precision's offloaded state.
PART_OF_A_NODE = [c for c in LORA if c.size != "1.5B"]


@pytest.mark.parametrize("cell", [c for c in BF16 + LORA if c.fits and c not in PART_OF_A_NODE],
                         ids=lambda c: c.id)
def test_mixed_fits_those_cells_only_by_offloading_to_host_ram(cell: Cell) -> None:
    """What the modes buy: mixed precision fits the same GPUs only with its state moved to
    host RAM (slower steps); with the parameters too where its optimizer step (16 B a
    parameter on the GPU: 27.3 GiB of 21.4 for 1.5B on an L4, 78.4 of 75.6 for 72B on 16
    H100s) or its training state does not fit: 1.5B, 3B and 72B (7B on four A100s holds
    its weights and gradients since the update's logits are chunked)."""
    mixed = plan_memory(parse_spec(easyr1_job(cell, "mixed"))).settings
    assert mixed.offload_optimizer, cell.source
    params_too = cell.row == "LoRA" or cell.size in ("1.5B", "3B", "72B")
    assert mixed.offload_params == params_too, cell.source


@pytest.mark.parametrize("cell", PART_OF_A_NODE, ids=lambda c: c.id)
def test_mixed_does_not_fit_those_cells_within_their_share_of_the_nodes_host(cell: Cell) -> None:
    """3B on one of eight L4s, 7B on two of four RTX 5090s, 32B and 72B on two and four of
    eight H100s: mixed precision would offload more than the worker's share of host RAM
    (its GPUs over the node's), so it is refused on the host, and the refusal still names
    the cheaper mode."""
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(easyr1_job(cell, "mixed")))
    assert any(n.startswith("host peak") for n in err.value.numbers), err.value.numbers
    # Another mode changes the training: after what changes only the hardware.
    modes = [i for i, s in enumerate(err.value.suggestions) if "training fits" in s]
    assert modes and err.value.suggestions[modes[0]].startswith("bf16 training fits")
    assert not [s for s in err.value.suggestions[modes[0]:] if s.startswith("resources.")]


def test_a_mode_that_fits_only_by_offloading_says_what_it_costs_in_host_ram() -> None:
    """72B on four of eight H100s in mixed precision: bf16 fits those GPUs only with its
    parameters, gradients and optimizer state in host RAM, and the refusal says so with
    the host peak of that plan, not only its small GPU peak."""
    cell = LORA[-1]
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(easyr1_job(cell, "mixed")))
    bf16 = plan_memory(parse_spec(easyr1_job(cell, "bf16")))
    assert bf16.settings.offload_params
    line = next(s for s in err.value.suggestions if "training fits" in s)
    assert line.startswith("bf16 training fits on your 4 GPUs (training peak"), line
    assert (f"by offloading its parameters, gradients and optimizer state to host RAM (host "
            f"peak {bf16.budget.peak_host_gib:.1f} of {bf16.budget.host_capacity_gib:.1f} GiB "
            "per node; slower steps): set spec.training.precision: bf16") in line, line


def test_the_issue_example_16_h100_72b_mixed_is_refused_with_bf16_and_lora_and_numbers() -> None:
    doc = easyr1_job(BF16[-1], "mixed", offloadParams=False, offloadOptimizer=False)
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(doc))
    e = err.value
    assert e.summary.startswith("infeasible: Qwen/Qwen2.5-VL-72B-Instruct (73.4B) on 2 x 8 "
                                "H100-80GB in mixed precision does not fit")
    # Cheapest for the user first: a pinned offload turned on (the optimizer's alone is
    # not enough: 72B's update needs its parameters off the GPU too), unpinning, the
    # cluster changes mixed precision would need, then bf16 (still full fine-tuning) with
    # the GPUs it needs without offload, then LoRA with the fewest GPUs it needs.
    assert e.suggestions[0].startswith("memory.offloadParams: true instead of false (fits, "
                                       "the other knobs as pinned; GPU "), e.suggestions[0]
    assert e.suggestions[1] == ("unset memory.offloadOptimizer, memory.offloadParams (let the "
                                "planner choose)")
    assert e.suggestions[2:4] == ["resources.nodes: 4 (32 GPUs)",
                                  "resources.gpuType: H200-141GB (140 GiB per GPU)"]
    assert e.suggestions[4].startswith("bf16 training fits on 4 nodes (32 GPUs)")
    assert e.suggestions[5].startswith("LoRA fits on your 16 GPUs")
    assert "it needs only 8 (resources.nodes: 1, gpusPerNode: 8)" in e.suggestions[5]


def test_a_plan_that_offloads_says_which_mode_would_not_need_to() -> None:
    """16 H100s and a 72B model in mixed precision: not refused (the Adam moments go to
    host RAM), but the plan says the cheapest mode that would hold everything on the
    GPU: LoRA (bf16 offloads its optimizer state there too)."""
    plan = plan_memory(parse_spec(easyr1_job(BF16[-1], "mixed")))
    assert plan.settings.offload_optimizer
    hint = next(d for d in plan.decisions if d.knob == "cheaperMode")
    assert hint.value == "lora" and "without offload" in hint.reason
    assert "spec.lora" in hint.reason
    in_lora = plan_memory(parse_spec(easyr1_job(BF16[-1], "lora")))
    assert not (in_lora.settings.offload_optimizer or in_lora.settings.offload_params)
    assert not [d for d in in_lora.decisions if d.knob == "cheaperMode"]


def test_a_mode_that_needs_more_nodes_says_how_many() -> None:
    doc = easyr1_job(LORA[-1], "mixed", offloadParams=False, offloadOptimizer=False)
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(doc))
    assert ("bf16 training fits on 8 nodes (32 GPUs): set spec.training.precision: bf16, "
            "resources.nodes: 8") in err.value.suggestions
    # The modes come after the hardware (resources.nodes: 8), bf16 before LoRA.
    assert err.value.suggestions[0] == "resources.nodes: 8 (32 GPUs)"
    assert err.value.suggestions[2].startswith("LoRA fits on 2 nodes (8 GPUs): add spec.lora")
    assert err.value.suggestions[2].endswith("resources.nodes: 2")


def test_a_lora_job_that_does_not_fit_proposes_no_other_mode() -> None:
    cell = Cell("LoRA", "72B", "H100-80GB", 2, "")
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(easyr1_job(cell, offloadParams=False, offloadOptimizer=False)))
    assert "in LoRA does not fit" in err.value.summary
    assert not [s for s in err.value.suggestions if "fits on" in s and "training" in s]


# --- What each mode keeps per parameter (docs/memory-model.md, "Training modes").


def _state(mode: str) -> tuple[dict[str, float], float, int]:
    """(training terms, P / W in GiB, world) for Qwen2.5-VL-7B on 8 H100s."""
    cell = Cell("x", "7B", "H100-80GB", 8, "")
    plan = plan_memory(parse_spec(easyr1_job(cell, mode)))
    p = plan.geometry.shape.parameters
    return plan.budget.gpu_stages["training"], p / plan.world_size / GIB, plan.world_size


def test_mixed_keeps_16_bytes_bf16_10_bytes_per_parameter() -> None:
    mixed, per, _ = _state("mixed")
    bf16, _, _ = _state("bf16")
    assert (mixed["fp32_master_params_shard"] + mixed["fp32_grads_shard"]
            + mixed["adam_moments_shard"]) == pytest.approx(16 * per)
    assert (bf16["bf16_params_shard"] + bf16["bf16_grads_shard"]
            + bf16["adam_moments_bf16_shard"] + bf16["kahan_compensation_bf16_shard"]
            ) == pytest.approx(10 * per)
    assert "fp32_master_params_shard" not in bf16
    # Both keep a bf16 reference copy for the KL term.
    assert mixed["reference_model_shard"] == bf16["reference_model_shard"] == pytest.approx(2 * per)


def test_lora_keeps_a_frozen_bf16_base_no_reference_copy_and_adapter_sized_state() -> None:
    lora, per, world = _state("lora")
    shape = KNOWN_MODELS["qwen2.5-vl-7b"]
    adapters = lora_plan(shape, LoraSpec.model_validate({})).adapter_parameters
    assert lora["frozen_base_bf16_shard"] == pytest.approx(2 * per)
    assert lora["reference_model_shard"] == 0  # the adapter disabled is the reference
    trained = (lora["adapter_fp32_params_shard"] + lora["adapter_fp32_grads_shard"]
               + lora["adapter_adam_moments_shard"])
    assert trained == pytest.approx(16 * adapters / world / GIB)
    # Rank 32 on the 7 linears of 28 layers: 28 x 32 x sum(in + out) = 80.7M, ~1% of 8.3B.
    assert adapters == 28 * 32 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))


TINY_VL = {
    "model_type": "qwen2_5_vl", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 1000, "tie_word_embeddings": False,
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                      "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                      "hidden_act": "silu"},
}  # fmt: skip


@pytest.mark.parametrize(
    "lora",
    [{"rank": 8}, {"rank": 4, "targetModules": ["q_proj", "v_proj"]},
     {"rank": 4, "excludeModules": ""}],
    ids=["all-linear", "q-v", "vision-too"],
)
def test_adapter_size_matches_the_linears_of_the_real_model(lora: dict[str, Any]) -> None:
    """The planner's count from the shape equals rank x (in + out) summed over the
    nn.Linear modules of the transformers model that the spec's targets and exclude
    regex select (lm_head never), module names as transformers spells them."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(**{k: v for k, v in TINY_VL.items() if k != "model_type"})
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    spec = LoraSpec.model_validate(lora)
    real = sum(
        spec.rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head") and spec.adapts(name)
    )
    assert lora_plan(shape_from_config(TINY_VL), spec).adapter_parameters == real


# --- The API fields and what they render into.

BASE = {"model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"}, "data": {"train": "t"},
        "resources": {"gpuType": "H100-80GB", "nodes": 1}, "checkpoint": {"size": "1Ti"}}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"lora": {"rank": 0}}, "spec.lora.rank"),
        ({"lora": {"targetModules": []}}, "spec.lora.targetModules"),
        ({"lora": {"targetModules": ["all-linear", "q_proj"]}}, "spec.lora.targetModules"),
        ({"lora": {"targetModules": ["q proj"]}}, "spec.lora.targetModules"),
        ({"lora": {"excludeModules": "(visual"}}, "spec.lora.excludeModules"),
        ({"training": {"precision": "fp16"}}, "spec.training.precision"),
        ({"lora": {}, "training": {"precision": "bf16"}}, "training.precision: bf16 with lora"),
    ],
)
def test_bad_mode_fields_are_refused_naming_the_field(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_spec(BASE | patch)


def test_the_spec_renders_into_actor_precision_and_actor_lora() -> None:
    job = JobRef("j", "ns", "uid")
    full = parse_spec(BASE | {"training": {"precision": "bf16"}})
    actor = trainer_config(full, plan_memory(full), job)["actor"]
    assert actor["precision"] == "bf16" and "lora" not in actor  # full fine-tuning
    lora = parse_spec(BASE | {"lora": {"rank": 16, "alpha": 32, "targetModules": ["q_proj"],
                                       "excludeModules": ""}})
    cfg = trainer_config(lora, plan_memory(lora), job)
    assert cfg["actor"]["precision"] == "mixed"
    assert cfg["actor"]["lora"] == {"rank": 16, "alpha": 32.0, "target_modules": ["q_proj"],
                                    "exclude_modules": None}
    default = parse_spec(BASE | {"lora": {}})
    loaded = Config.model_validate(trainer_config(default, plan_memory(default), job))
    assert loaded.actor.lora is not None
    assert (loaded.actor.lora.rank, loaded.actor.lora.target_modules,
            loaded.actor.lora.exclude_modules) == (32, "all-linear", r".*visual.*")


def test_status_plan_names_the_mode() -> None:
    for patch, mode in (({}, "mixed"), ({"training": {"precision": "bf16"}}, "bf16"),
                        ({"lora": {}}, "lora")):
        status = plan_status(plan_memory(parse_spec(BASE | patch))).to_wire()
        assert status["mode"] == mode
        assert status["precision"] == ("bf16" if mode == "bf16" else "mixed")


def test_lora_cannot_be_added_to_a_running_job() -> None:
    problem = admission_problem(BASE | {"lora": {}}, BASE)
    assert problem is not None and "spec.lora cannot change" in problem
