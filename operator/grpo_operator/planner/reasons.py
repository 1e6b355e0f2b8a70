"""One line per decision, with the numbers behind it."""

from __future__ import annotations

from grpo_api.contract import PACKED_WIDTH_ALIGNMENT, RANK0_GROUP, RANK0_NODE_LABEL
from grpo_api.knobs import (
    GRADIENT_CHECKPOINTING,
    MICRO_BATCH_SIZE,
    MICRO_BATCH_TOKENS,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAMS,
    PINNABLE,
    RANK0_INIT,
    RAY_OBJECT_STORE,
    ROLLOUT_GPU_MEMORY_UTILIZATION,
    ROLLOUT_N,
    Knob,
)

from .budget import BF16_B, GIB
from .head import data_rows, head_terms, length_workers
from .layout import per_rank_samples, token_budgets
from .modes import FROZEN, LORA, STATE
from .resources import Pods, ray_default_store_gib, step_data_gib
from .sizes import kv_bytes_per_token
from .types import RANK0_LOAD_TERM, Budget, Decision, Geometry, PodResources, Settings


def _g(x: float) -> str:
    return f"{x:.1f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _stage(b: Budget, name: str) -> float:
    return sum(b.gpu_stages.get(name, {}).values())


def trained_parameters(geo: Geometry) -> int:
    return geo.lora.adapter_parameters if geo.lora is not None else geo.shape.parameters


def mode_decision(geo: Geometry, st: Settings) -> Decision:
    """The training mode, what each parameter costs in it, and where it came from."""
    mode = geo.mode(st)
    per = " + ".join(f"{t.bytes_per_param} {t.name.removesuffix('_shard')}"
                     for t in STATE[mode])
    if mode == LORA and geo.lora is not None:
        lora = geo.lora
        share = lora.adapter_parameters / geo.shape.parameters
        unsized = f"; not sized (no shape known): {', '.join(lora.unsized)}" if lora.unsized else ""
        why = (
            f"spec.lora: rank {lora.rank} on {lora.adapted_per_layer} linears per layer x "
            f"{geo.shape.layers} layers{' + the vision tower' if lora.vision_adapted else ''}"
            f" = {_params(lora.adapter_parameters)} adapter parameters ({share:.2%} of the "
            f"model); bytes per parameter: {per}; the reference policy is the adapter "
            f"disabled (no copy){unsized}"
        )
        return Decision("mode", mode, "spec", why)
    why = f"spec.training.precision: {st.precision}; bytes per parameter: {per}"
    return Decision("mode", mode, "spec", why)


def explain(
    geo: Geometry,
    st: Settings,
    b: Budget,
    trail: list[tuple[Settings, Budget]],
    pinned: frozenset[str],
    nodes_reason: str,
) -> list[Decision]:
    weights = geo.shape.parameters * BF16_B / GIB
    out = [
        Decision(
            "model",
            _params(geo.shape.parameters),
            "auto",
            f"{geo.shape.layers} layers, hidden {geo.shape.hidden_size}, vocab "
            f"{geo.shape.vocab_size}, vision {_params(geo.shape.vision_parameters)}; "
            f"from {geo.shape_source}",
        ),
        Decision(
            "cluster",
            (
                f"{geo.nodes} x {geo.gpus_per_node} {geo.gpu}"
                if geo.nodes
                else f"head pod only, {geo.gpus_per_node} CPU ranks"
            ),
            "spec" if nodes_reason.startswith("spec") else "auto",
            f"{nodes_reason}; world size {geo.world_size}",
        ),
    ]

    def src(knob: Knob) -> str:
        return "spec" if knob.setting in pinned else "auto"

    every_rank = geo.ranks_per_node * weights
    rank0_load = b.host_load_terms.get(RANK0_LOAD_TERM, 0.0)
    out.append(
        Decision(
            RANK0_INIT.spec,
            str(st.rank0_init).lower(),
            src(RANK0_INIT),
            (
                f"only rank 0 loads the model, in float32 as the trainer reads it "
                f"({_g(rank0_load)} host RAM with loader buffers, on rank 0's node); "
                f"otherwise {geo.ranks_per_node} ranks per node would hold {_g(every_rank)} "
                f"of host RAM and each {'GPU' if geo.is_gpu else 'rank'} a full copy at load"
                if st.rank0_init
                else f"single rank: loading the {_g(weights)} model once is the same either way"
                if geo.world_size == 1
                else f"set in spec; every rank loads {_g(weights)} at load time"
            ),
        )
    )
    cap = b.gpu_capacity_gib
    train = _stage(b, "training")
    no_gc = next((tb for ts, tb in trail if not ts.gradient_checkpointing), None)
    if (st.gradient_checkpointing and no_gc is not None
            and GRADIENT_CHECKPOINTING.setting not in pinned):
        why = (
            f"without it training peaks at {_g(_stage(no_gc, 'training'))} > "
            f"{_g(cap - b.gpu_margin_gib)} (usable less the margin); "
            f"with it {_g(train)} (activations "
            f"{_g(b.gpu_stages.get('training', {}).get('activations', 0))})"
        )
    elif geo.is_gpu:
        why = f"training peak {_g(train)} of {_g(cap)} usable per GPU"
    else:
        why = "cpu job: host RAM only, no GPU budget"
    out.append(
        Decision(
            GRADIENT_CHECKPOINTING.spec,
            str(st.gradient_checkpointing).lower(),
            src(GRADIENT_CHECKPOINTING),
            why,
        )
    )
    out.append(mode_decision(geo, st))
    state = sum(
        (geo.shape.parameters if t.kind == FROZEN else trained_parameters(geo))
        * t.bytes_per_param for t in STATE[geo.mode(st)]
    ) / GIB
    out.append(
        Decision(
            "sharding",
            f"full over {geo.world_size}",
            "auto",
            f"FSDP2 fully_shard over all ranks: params, grads and optimizer state "
            f"({_g(state)} in all) are {_g(state / geo.world_size)} per rank",
        )
    )
    out.extend(_micro_batch(geo, st, b, trail, src(MICRO_BATCH_SIZE),
                            src(MICRO_BATCH_TOKENS)))
    host = sum(b.host_terms.values())
    for knob, key in (
        (OFFLOAD_OPTIMIZER, "offloaded_optimizer"),
        (OFFLOAD_PARAMS, "offloaded_params_and_grads"),
    ):
        on = getattr(st, knob.setting)
        if on:
            why = (
                f"GPU does not fit otherwise; costs {_g(b.host_terms.get(key, 0))} host per "
                f"node, host peak {_g(host)} of {_g(b.host_capacity_gib)} usable"
            )
        else:
            vllm = ("no vLLM on these GPUs (disaggregated)" if geo.rollout is not None
                    else "rollout leaves vLLM "
                    f"{_g(st.rollout_gpu_memory_utilization * geo.gpu_memory_gib)}")
            why = (
                f"GPU fits without it (training {_g(train)} of {_g(cap)}, {vllm}); offload "
                "would only move memory to host RAM and slow every step"
                if geo.is_gpu
                else "cpu job: everything already lives in host RAM"
            )
        out.append(Decision(knob.spec, str(on).lower(), src(knob), why))
    if geo.is_gpu:
        kv_tokens = (
            b.rollout_kv_cache_gib
            * GIB
            * b.rollout_tensor_parallel
            / max(1.0, kv_bytes_per_token(geo))
        )
        # Disaggregated: vLLM's share of a rollout GPU, which the actor never shares.
        card = geo.rollout.gpu_memory_gib if geo.rollout else geo.gpu_memory_gib
        beside = (f"the rollout GPU ({geo.rollout.gpu}) is vLLM's alone" if geo.rollout
                  else f"the actor keeps "
                  f"{_g(b.gpu_stages['rollout'].get('actor_resident', 0))} resident")
        out.append(
            Decision(
                ROLLOUT_GPU_MEMORY_UTILIZATION.spec,
                f"{st.rollout_gpu_memory_utilization:.2f}",
                src(ROLLOUT_GPU_MEMORY_UTILIZATION),
                f"vLLM gets {_g(st.rollout_gpu_memory_utilization * card)}: "
                f"weights {_g(b.engine_weights_gib)} (TP "
                f"{b.rollout_tensor_parallel}) + KV cache {_g(b.rollout_kv_cache_gib)} "
                f"(~{int(kv_tokens)} tokens); needs >= {b.rollout_min_utilization:.2f}; "
                f"{beside}",
            )
        )
    out.append(
        Decision(
            ROLLOUT_N.spec,
            str(st.rollout_n),
            "spec",
            "never lowered by the planner or a remediation: it is the algorithm's, and "
            "what it costs is bounded by other knobs (vLLM's KV cache by its share, the "
            "update by its micro-batch)",
        )
    )
    default_store = ray_default_store_gib(geo.host_memory_gib)
    out.append(
        Decision(
            RAY_OBJECT_STORE.spec,
            _g(st.ray_object_store_gib),
            src(RAY_OBJECT_STORE),
            f"a step moves ~{_g(step_data_gib(geo, st.rollout_n))}; Ray's default would take "
            f"{_g(default_store)} (30% of {_g(geo.host_memory_gib)}, capped at 200 GB)",
        )
    )
    out.append(
        Decision(
            "hostMemory",
            _g(b.peak_host_gib),
            "auto",
            f"per node: steady {_g(host)}, while loading {_g(b.load_host_peak_gib)}; usable "
            f"{_g(b.host_capacity_gib)} of {_node_part(geo)} {_g(geo.host_memory_gib)} RAM "
            f"(Ray kills at 95%); node RAM and CPUs: {geo.node_source}",
        )
    )
    return out


def _micro_batch(geo: Geometry, st: Settings, b: Budget, trail: list[tuple[Settings, Budget]],
                 size_src: str, tokens_src: str) -> list[Decision]:
    """The micro-batch: by tokens (the largest budget that fits, and why not the one
    above), or by samples when the spec pins microBatchSize."""
    per_rank = per_rank_samples(geo)
    train = b.gpu_stages.get("training", {})
    if not st.micro_batch_tokens:
        return [
            Decision(MICRO_BATCH_SIZE.spec, str(st.micro_batch_size), size_src,
                     f"{per_rank} samples per rank per update -> "
                     f"{per_rank // st.micro_batch_size} accumulation steps; "
                     f"{geo.sequence_length} tokens per sample"),
            Decision(MICRO_BATCH_TOKENS.spec, "0", size_src,
                     "micro-batches go by samples: the spec sets microBatchSize"),
        ]
    budgets = token_budgets(geo, st.rollout_n)
    larger = [(ts, tb) for ts, tb in trail if ts.micro_batch_tokens > st.micro_batch_tokens]
    terms = (f"activations {_g(train.get('activations', 0))}, attention mask "
             f"{_g(train.get('attention_mask', 0))} (rows padded to a multiple of "
             f"{PACKED_WIDTH_ALIGNMENT} tokens), log-prob head {_g(train.get('logits', 0))}")
    if tokens_src == "spec":
        why = f"set in spec; training peak {_g(_stage(b, 'training'))} ({terms})"
    elif st.micro_batch_tokens >= budgets[0]:
        why = (f"the rank's whole mini-batch ({per_rank} samples, at most {budgets[0]} tokens "
               f"in the shared-prefix layout) in one micro-batch; training peak "
               f"{_g(_stage(b, 'training'))} ({terms})")
    elif larger:
        ts, tb = larger[-1]
        usable = b.gpu_capacity_gib - b.gpu_margin_gib
        why = (f"the largest budget that fits: {ts.micro_batch_tokens} tokens would peak at "
               f"{_g(tb.peak_gpu_gib)} ({tb.peak_gpu_stage}) > {_g(usable)} "
               f"(usable less the margin); with {st.micro_batch_tokens}: training "
               f"{_g(_stage(b, 'training'))} ({terms})")
    else:
        why = f"training peak {_g(_stage(b, 'training'))} ({terms})"
    return [
        Decision(MICRO_BATCH_SIZE.spec, str(st.micro_batch_size), size_src,
                 "not used: micro-batches go by tokens (microBatchTokens)"),
        Decision(MICRO_BATCH_TOKENS.spec, str(st.micro_batch_tokens), tokens_src,
                 f"{why}; rows of the shared-prefix layout (a group's prompt once, then its "
                 f"responses) x the widest, padding included, at least one whole sample "
                 f"({geo.sequence_length} tokens); {per_rank} samples per rank per update"),
    ]


def explain_margin(geo: Geometry, b: Budget, pinned: frozenset[str]) -> Decision:
    """The GPU memory the plan keeps free under the usable memory: the margin, or, when
    pinned knobs leave less, how much less (the planner does not override a pin)."""
    if not geo.is_gpu:
        return Decision("gpuMargin", "-", "auto", "cpu job: no GPU budget")
    left, margin, cap = b.gpu_margin_left_gib, b.gpu_margin_gib, b.gpu_capacity_gib
    if left >= margin:
        return Decision(
            "gpuMargin",
            _g(margin),
            "auto",
            f"kept free under {_g(cap)} usable per GPU for NCCL communicators, cuBLAS "
            f"workspaces and allocator slack (docs/memory-model.md); the {b.peak_gpu_stage} "
            f"peak leaves {_g(left)}",
        )
    names = ", ".join(f"memory.{PINNABLE[k]}" for k in sorted(pinned))
    return Decision(
        "gpuMargin",
        _g(left),
        "spec",
        f"LESS THAN THE {_g(margin)} MARGIN: with {names} as the spec pins them the "
        f"{b.peak_gpu_stage} peak is {_g(b.peak_gpu_gib)} of {_g(cap)} usable per GPU; "
        "kept as pinned, but NCCL, cuBLAS workspaces or fragmentation may not fit; "
        "unpin to let the planner keep the margin",
    )


def _node_part(geo: Geometry) -> str:
    """Which part of its node a worker plans in and asks for (Geometry.node_share)."""
    if geo.node_share >= 1:
        return "the node's"
    return f"its share ({geo.gpus_per_node} of {geo.node_gpus} GPUs) of the node's"


def _head_terms(geo: Geometry) -> str:
    """The head's host terms, named: the driver's row index and its length pass grow
    with the data (planner/head.py)."""
    terms = head_terms(geo)
    rows = data_rows(geo)
    out = [f"Ray and the driver {_g(terms['ray_and_driver'])}",
           f"the index of {rows:,} rows{'' if geo.data_rows else ' (spec.data.rows unset)'} "
           f"{_g(terms['row_index'])}"]
    out.append(f"a step's responses as text {_g(terms['responses_in_flight'])}")
    if "length_pass" in terms:
        out.append(f"the length pass in {length_workers(geo)} processes "
                   f"{_g(terms['length_pass'])}")
    return ", ".join(out)


def explain_pods(geo: Geometry, pods: Pods, b: Budget) -> list[Decision]:
    head, worker, rank0 = pods.head, pods.worker, pods.rank0
    out = [
        Decision(
            "headPod",
            f"{head.cpus} CPU, {head.memory_gib}Gi, shm {head.shm_gib}Gi",
            "auto",
            "Ray head + driver (" + _head_terms(geo) + ")"
            + (
                "; offers Ray no CPU or GPU (num-cpus 0, num-gpus 0), so every rank "
                "actor goes to a worker"
                if worker
                else f" + the ranks (host peak {_g(b.peak_host_gib)})"
            )
            + "; /dev/shm = object store + 2 GiB; no GPU, no GPU node selector",
        )
    ]
    if rank0 is not None:
        out.append(Decision(
            "rank0Pod", _shape(rank0), "auto",
            f"rank 0's node, a worker group of its own ({RANK0_GROUP}, Ray node label "
            f"{RANK0_NODE_LABEL}=true, where the trainer places ranks 0-"
            f"{geo.ranks_per_node - 1}): memory = its host peak {_g(b.peak_host_gib)} "
            f"({b.host_peak_stage}: rank 0 reads the whole model, "
            f"{_g(b.host_load_terms.get(RANK0_LOAD_TERM, 0.0))}) / 0.9; the other workers "
            f"do not, and ask for their own peak ({_g(b.peak_host_other_gib)})"))
    if worker is not None:
        selector = ", ".join(f"{k}={v}" for k, v in worker.node_selector.items()) or "none"
        peak = b.peak_host_other_gib if rank0 is not None else b.peak_host_gib
        out.append(
            Decision(
                "workerPods",
                _shape(worker),
                "auto",
                f"memory = host peak {_g(peak)} / 0.9 (capped at "
                f"{_node_part(geo)} allocatable); 90% of {_node_part(geo)} CPUs; "
                f"nodeSelector {selector}"
                + ("; tolerates nvidia.com/gpu:NoSchedule" if worker.tolerations else ""),
            )
        )
    return out


def _shape(pod: PodResources) -> str:
    return (f"{pod.replicas} x ({pod.gpus} GPU, {pod.cpus} CPU, {pod.memory_gib}Gi, "
            f"shm {pod.shm_gib}Gi)")
