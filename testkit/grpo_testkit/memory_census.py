"""Count what a rank's FSDP2 update really holds, by component (the plan-equals-tensors
test, tests/trainer/test_plan_equals_tensors.py; spawned ranks import it by name).

A census walks the structures that own the training state and adds up the bytes of
their storages, each storage once: the actor's and the reference model's FSDP2
parameters (the sharded storage, and the all-gathered copies while they exist), their
gradients (the sharded ``.grad`` and the unsharded ones FSDP2 keeps while gradient sync
is off), FSDP2's reduce-scatter input buffers, and the optimizer's state. Components
are named after the planner's terms (``planner/modes.py``); ``measure`` runs a real
``Worker``'s update and takes a census after each micro-batch's backward and right
after the optimizer step (before the gradients are zeroed): the planner's peak points.
During each micro-batch it also samples the sum of FSDP2's transient buffers (gathered
parameters, unsharded gradients, reduce-scatter inputs), apart while a block runs and
at the root's moments: the planner's two FSDP2 buffer terms (``planner/fsdp.py``).
Wrapping ``_micro_step``, ``optimizer.step``, FSDP2's ``post_backward`` and its
reduce-scatter copy-in is a measurement seam: the calls go through unchanged.

The log-prob head and the weight sync are measured as live bytes (``LiveBytes``: every
storage an operation creates while it watches, until it is freed): the chunked head's
forward and backward on every call (``HeadProbe``, through ``ChunkedHead``'s two static
methods), and one weight sync after the update (``sync_peak``).
"""

from __future__ import annotations

import gc
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

WEIGHTS = "weights"  # trained parameters' shards (mixed: fp32 master weights)
FROZEN = "frozen"  # LoRA's frozen base, sharded
GRADS = "grads"  # sharded gradients
GRADS_UNSHARDED = "grads_unsharded"  # whole-parameter gradients FSDP2 keeps (no-sync)
REDUCE_BUFFERS = "reduce_scatter_buffers"  # FSDP2's retained reduce-scatter inputs
GATHERED = "gathered"  # all-gathered (unsharded) parameters of the actor
OPTIMIZER = "optimizer"  # every tensor of the optimizer's state
REFERENCE = "reference"  # the reference model's parameters, sharded and gathered
COMPONENTS = (WEIGHTS, FROZEN, GRADS, GRADS_UNSHARDED, REDUCE_BUFFERS, GATHERED, OPTIMIZER,
              REFERENCE)


class _Tally:
    """Bytes per component, each storage counted once (views share one), and each
    tensor's own bytes: what a pinned host block is made for when it is copied or pinned
    on its own on a GPU node (FSDP2 copies each offloaded gradient out of its unit's
    reduce-scatter buffer, whose views the gradients are here)."""

    def __init__(self) -> None:
        self.bytes: Counter[str] = Counter({c: 0 for c in COMPONENTS})
        self.blocks: dict[str, list[int]] = {c: [] for c in COMPONENTS}
        self._seen: set[int] = set()
        self._tensors: set[tuple[int, int]] = set()

    def add(self, component: str, t: torch.Tensor | None) -> None:
        if t is None:
            return
        from torch.distributed.tensor import DTensor

        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        if storage.nbytes() == 0:
            return  # freed (FSDP2 resizes a resharded copy's storage to 0)
        tensor = (local.data_ptr(), local.numel() * local.element_size())
        if tensor not in self._tensors:
            self._tensors.add(tensor)
            self.blocks[component].append(tensor[1])
        if storage.data_ptr() not in self._seen:  # not counted yet
            self._seen.add(storage.data_ptr())
            self.bytes[component] += storage.nbytes()


def _groups(model: nn.Module) -> Iterator[Any]:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            yield from module._get_fsdp_state()._fsdp_param_groups


def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    for group in _groups(model):
        yield from group.fsdp_params


def _flat_gathered(model: nn.Module) -> Iterator[torch.Tensor]:
    """All-gather outputs before their copy into the parameters: a prefetched unit's,
    and the one FSDP2 keeps until the next unit's copy-out in forward."""
    for group in _groups(model):
        for result in (group._all_gather_result,
                       getattr(group.comm_ctx.all_gather_state, "all_gather_result", None)):
            if result is not None:
                yield result.all_gather_output


def _reduce_inputs(model: nn.Module) -> Iterator[torch.Tensor]:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        for rs in model._get_fsdp_state()._comm_ctx.reduce_scatter_states:
            yield rs.reduce_scatter_input


def _add_model(tally: _Tally, model: nn.Module, *, reference: bool) -> None:
    for fp in _fsdp_params(model):
        trained = fp.sharded_param.requires_grad
        shard = REFERENCE if reference else (WEIGHTS if trained else FROZEN)
        tally.add(shard, fp._sharded_param_data)
        for gathered in fp.all_gather_outputs:
            tally.add(REFERENCE if reference else GATHERED, gathered)
        tally.add(GRADS, fp.sharded_param.grad)
        tally.add(GRADS_UNSHARDED, fp.unsharded_accumulated_grad)
        unsharded = getattr(fp, "_unsharded_param", None)
        if unsharded is not None:
            tally.add(GRADS_UNSHARDED, unsharded.grad)
    for flat in _flat_gathered(model):
        tally.add(REFERENCE if reference else GATHERED, flat)
    for buf in _reduce_inputs(model):
        tally.add(REDUCE_BUFFERS, buf)


BLOCKS = "blocks"  # census key: each component's tensors' own bytes


def census(actor: nn.Module, ref: nn.Module | None, optimizer: torch.optim.Optimizer
           ) -> dict[str, Any]:
    """Bytes of every component this rank holds now, and (``BLOCKS``) each of their
    tensors' own bytes."""
    tally = _Tally()
    _add_model(tally, actor, reference=False)
    if ref is not None and ref is not actor:
        _add_model(tally, ref, reference=True)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                tally.add(OPTIMIZER, value)
    return {**tally.bytes, BLOCKS: tally.blocks}


class _PeakSampler:
    """Largest bytes of FSDP2's own buffers (gathered parameters, unsharded gradients,
    reduce-scatter inputs) held at one moment while enabled, apart for the moments when
    a block (a decoder layer or vision block) runs (``layers``) and the others, the root's
    (``root``). Sampled at every module's forward (before and after), when the gradient
    of a module's output arrives (the start of its backward), when a unit's post-backward
    starts (all its gradients computed) and inside each reduce-scatter's copy-in, where
    the unit's whole gradients and its new float32 input are both alive (a measurement
    seam on torch's function)."""

    _TRANSIENT = (GATHERED, GRADS_UNSHARDED, REDUCE_BUFFERS)

    def __init__(self, actor: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        self.actor = actor
        self.enabled = False
        self.peak: Counter[str] = Counter()
        blocks = [m for m in actor.modules() if isinstance(m, FSDPModule) and m is not actor]
        self._in_block = {id(sub) for b in blocks for sub in b.modules()}
        self._handles = []
        for module in actor.modules():
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))
        self._groups = list(_groups(actor))
        block_groups = {id(g) for b in blocks for g in b._get_fsdp_state()._fsdp_param_groups}
        for group in self._groups:
            group.post_backward = self._during(group.post_backward, id(group) in block_groups)
        self._reducing_block = False
        self._collectives = _fsdp_collectives
        self._copy_in = _fsdp_collectives.foreach_reduce_scatter_copy_in
        _fsdp_collectives.foreach_reduce_scatter_copy_in = self._sampled_copy_in

    def sample(self, in_block: bool, grads: tuple[torch.Tensor, ...] = (),
               rs_input: torch.Tensor | None = None) -> None:
        if not self.enabled:
            return
        tally = _Tally()
        _add_model(tally, self.actor, reference=False)
        for t in grads:
            tally.add(GRADS_UNSHARDED, t)
        tally.add(REDUCE_BUFFERS, rs_input)
        part = "layers" if in_block else "root"
        self.peak[part] = max(self.peak[part], sum(tally.bytes[k] for k in self._TRANSIENT))

    def _sampled_copy_in(
        self, unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor,
        world_size: int,
    ) -> None:
        self.sample(self._reducing_block, tuple(unsharded_grads), reduce_scatter_input)
        self._copy_in(unsharded_grads, reduce_scatter_input, world_size)

    def _during(self, fn: Callable[..., Any], block: bool) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.sample(block)
            self._reducing_block = block
            try:
                return fn(*args, **kwargs)
            finally:
                self._reducing_block = False

        return wrapped

    def _pre(self, module: nn.Module, args: Any) -> None:
        self.sample(id(module) in self._in_block)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        in_block = id(module) in self._in_block
        self.sample(in_block)
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(lambda grad: self.sample(in_block))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        for group in self._groups:
            del group.post_backward  # back to the class's method
        self._collectives.foreach_reduce_scatter_copy_in = self._copy_in


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for o in output:
            yield from _tensors(o)
    elif isinstance(output, dict) or hasattr(output, "values"):
        for o in output.values():
            yield from _tensors(o)


def _wrap(fn: Callable[..., Any], after: Callable[[], None]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        after()
        return out

    return wrapped


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created while active (outputs of operations that do not
    return a view or an input), counted until each is freed, and their peak. Storages
    that existed before (inputs, views of them, in-place results) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.peak = 0
        self._live: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for ret, t in zip(func._schema.returns, outs, strict=False):
            if ret.alias_info is None and isinstance(t, torch.Tensor):
                self._add(t)
        return out

    def _add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, n = storage.data_ptr(), storage.nbytes()
        if n == 0 or key in self._live:
            return
        self._live[key] = n
        self.now += n
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.now -= self._live.pop(key, 0)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class HeadProbe:
    """Every call of the chunked log-prob head (``lean_logprobs.ChunkedHead``): the
    response tokens, the chunk, and the bytes it holds at its peak, in forward (the
    picked hidden states and labels it is given, and what it makes) and in backward
    (the same, saved, and what it makes but the LM head's weight gradient, which the
    planner counts among FSDP2's buffers)."""

    def __init__(self) -> None:
        from grpo_trainer.algorithm.lean_logprobs import ChunkedHead

        self.calls: list[dict[str, Any]] = []
        self._cls = ChunkedHead
        self._forward, self._backward = ChunkedHead.forward, ChunkedHead.backward
        probe = self

        def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor,
                    labels: torch.Tensor, *rest: Any) -> Any:
            with LiveBytes() as live:
                out = probe._forward(ctx, hidden, weight, labels, *rest)
            probe.calls.append({"pass": "forward", "tokens": hidden.shape[0], "chunk": rest[1],
                                "bytes": _nbytes(hidden) + _nbytes(labels) + live.peak})
            return out

        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            hidden, _, labels = ctx.saved_tensors
            with LiveBytes() as live:
                grads = probe._backward(ctx, grad)
            held = _nbytes(hidden) + _nbytes(labels) + live.peak - _nbytes(grads[1])
            probe.calls.append({"pass": "backward", "tokens": hidden.shape[0],
                                "chunk": ctx.chunk, "bytes": held})
            return grads

        ChunkedHead.forward = staticmethod(forward)  # type: ignore[method-assign,assignment]
        ChunkedHead.backward = staticmethod(backward)  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        self._cls.forward = staticmethod(self._forward)  # type: ignore[method-assign]
        self._cls.backward = staticmethod(self._backward)  # type: ignore[method-assign]


class _SyncTarget:
    """The rollout engine's side of a weight sync as vLLM's takes it
    (``rollout.vllm_engine``: a copy of each tensor, let go once loaded; LoRA: every
    adapter at once), without generating: what the trainer holds meanwhile is measured."""

    def load_weights(self, weights: Any) -> None:
        from grpo_trainer.rollout.vllm_engine import _owned

        for _name, tensor in _owned(weights):
            del tensor

    def load_adapter(self, tensors: Any, lora: Any) -> None:
        pass


def sync_peak(worker: Any) -> int:
    """Peak bytes this rank holds beyond its state during one weight sync."""
    from grpo_trainer.rank.weight_sync import sync_rollout_weights

    st = worker.state
    with LiveBytes() as live:
        sync_rollout_weights(_SyncTarget(), st.actor, st.compute_dtype, st.cfg.actor.lora)
    return live.peak


def measure(worker: Any, advantages: list[float]) -> dict[str, Any]:
    """One update of ``worker`` (samples loaded): the census after each micro-batch's
    backward (``micro``, in order), right after the optimizer step (``step``), and
    the transient peaks over the micro-batches (``peak``), every call of the log-prob
    head (``head``), every forward's attention mask (``masks``) and a weight sync after
    the update (``sync``)."""
    micro: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    state = worker.state
    sampler = _PeakSampler(state.actor)
    head = HeadProbe()

    def after_micro() -> None:
        sampler.enabled = False
        micro.append(census(state.actor, state.ref, state.optimizer))

    def before_micro(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            sampler.enabled = True
            return fn(*args, **kwargs)

        return wrapped

    policy = worker.policy
    policy._micro_step = before_micro(_wrap(policy._micro_step, after_micro))
    from grpo_trainer.algorithm.packing import runs

    # Every forward's attention layout (the plan's term): its bytes, and the counts the
    # contract's formulas take, read from the samples (not from the layout).
    masks: list[dict[str, Any]] = []
    collate = policy._collate

    def collated(micro: Any) -> Any:
        batch = collate(micro)
        inputs = batch.model_inputs
        layout = inputs.get("segment_layout")
        masks.append({
            "bytes": _nbytes(inputs["attention_mask"]) + (layout.nbytes if layout else 0),
            "segments": layout is not None,
            "width": int(inputs["input_ids"].shape[1]),
            "prompts": [r[0].prompt.input_ids.numel() for r in runs(micro)],
            "responses": [n for s in micro if (n := s.response_ids.numel())],
            "dtype_bytes": policy.state.compute_dtype.itemsize,
        })
        return batch

    policy._collate = collated
    opt = state.optimizer
    opt.step = _wrap(opt.step, lambda: steps.append(census(state.actor, state.ref, opt)))
    try:
        metrics = worker.update(advantages, step=0)
    finally:
        sampler.remove()
        head.remove()
    return {"micro": micro, "step": steps, "peak": dict(sampler.peak), "metrics": metrics,
            "head": head.calls, "sync": sync_peak(worker), "masks": masks}


def rank_census(rank: int, world: int, arg: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each named mode in ``arg`` (``{"config": raw config, "samples": per rank
    [(Record fields, response ids)]}``): build a real ``Worker`` on this rank, install
    its samples, run one update and return ``measure``'s figures."""
    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record
    from grpo_trainer.rank.worker import Worker

    out: dict[str, Any] = {}
    for name, mode in arg.items():
        worker = Worker(build_config(mode["config"], environ={}), rank, world)
        worker.setup("127.0.0.1", 0)  # the process group exists: run_ranks made it
        items = mode["samples"][rank]
        worker.load_samples([(Record(**r), ids) for r, ids in items])
        out[name] = measure(worker, [1.0 if i % 2 else -1.0 for i in range(len(items))])
        del worker
        gc.collect()
    return out
