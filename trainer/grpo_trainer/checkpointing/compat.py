"""Whether a checkpoint loads under this run's settings, and how: pure, no torch.

A restart after an OOM resumes under the remediation ladder's next rung
(operator/grpo_operator/planner/ladder.py), not the settings the checkpoint was
written with. Most rungs (gradient checkpointing, micro-batch, vLLM's memory fraction,
offloading, Ray's store, pod memory) change nothing a checkpoint holds: the same keys,
shapes and dtypes, only where the tensors live, which DCP does not record. One does:
``actor.precision`` mixed <-> bf16 changes the weights' dtype, the optimizer (fused
AdamW <-> ``BF16AdamW``) and so the optimizer's state and param-group entries.

``plan_load`` compares what the checkpoint holds (DCP's metadata) with what this run's
model and optimizer ask for (their flattened state dict) and says how to load it:

- the same key, shape and dtype: read as is;
- the same key and shape, another floating dtype (fp32 <-> bf16): read and converted
  (the Adam moments; rounded to nearest into bf16);
- a weight saved in a wider dtype than this run keeps it in, with a Kahan compensation
  slot here that the checkpoint lacks (mixed -> bf16): the fp32 master is read whole,
  the weight becomes its bf16 rounding and the compensation what that rounding lost,
  exactly the pair ``BF16AdamW`` keeps, so the master carries over to ~16 mantissa bits
  instead of losing everything below bf16's 8;
- a compensation the checkpoint holds that this run has no slot for (bf16 -> mixed): read
  and added to the weight, which becomes the fp32 master the pair stood for;
- a compensation slot here with no wider master to derive it from: left at zero (its
  value after ``_init_optim_state``);
- a param-group entry only one of the two optimizers has (torch's ``amsgrad``,
  ``fused``, ``foreach``...): this run's optimizer keeps its own; the shared
  hyper-parameters (``HYPERPARAMETERS``) always come from the checkpoint.

Anything else (a weight or a moment missing on either side, another shape, a
non-floating dtype change, a tensor where a value was saved) cannot be loaded without
inventing or dropping training state: ``CheckpointIncompatible``, which names the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MODEL = "model."
STATE = "optim.state."
GROUPS = "optim.param_groups."
COMPENSATION = "compensation"  # BF16AdamW's Kahan buffer (optim/kahan_adamw.py)
# The param-group entries both optimizers have, which the checkpoint's values set; any
# other entry is one optimizer's own flag and stays what this run's optimizer built.
HYPERPARAMETERS = frozenset({"params", "lr", "betas", "eps", "weight_decay", "initial_lr"})
FLOATS = ("float64", "float32", "bfloat16", "float16")  # widest first
MAX_NAMED = 3  # problems named in the message; the count says how many more


@dataclass(frozen=True)
class Entry:
    """One flattened state-dict entry: a tensor's dtype (torch's name without
    ``torch.``) and global shape, or ``dtype`` None for a pickled value."""

    dtype: str | None
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoadPlan:
    """How this run loads a checkpoint (all keys are DCP's flattened ones)."""

    skip: frozenset[str] = frozenset()  # this run's keys not read: it keeps its own value
    convert: frozenset[str] = frozenset()  # read in the checkpoint's dtype, converted
    to_kahan: tuple[str, ...] = ()  # parameter names: saved master -> weight + compensation
    from_kahan: tuple[str, ...] = ()  # parameter names: saved weight + compensation -> master
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def identity(self) -> bool:
        """Whether the checkpoint loads as it is (the case of every rung but precision)."""
        return not (self.skip or self.convert or self.to_kahan or self.from_kahan)

    def summary(self) -> str:
        """One line for the log: what was converted."""
        if self.identity:
            return "as saved"
        kahan = {*self.to_kahan, *self.from_kahan}
        moved = self.convert - {MODEL + p for p in kahan}
        kept = self.skip - {f"{STATE}{p}.{COMPENSATION}" for p in self.to_kahan}
        parts = []
        if self.to_kahan:
            parts.append(f"{len(self.to_kahan)} weights from their saved masters, rounded, "
                         "with what the rounding lost as their Kahan compensation")
        if self.from_kahan:
            parts.append(f"{len(self.from_kahan)} weights plus their saved Kahan "
                         "compensation as masters")
        if moved:
            parts.append(f"{len(moved)} tensors converted to this run's dtype")
        if kept:
            parts.append(f"{len(kept)} entries kept as this run built them")
        return "; ".join(parts)


def _split_state(key: str) -> tuple[str, str] | None:
    """``optim.state.<param>.<name>`` -> (param, name)."""
    if not key.startswith(STATE):
        return None
    param, _, name = key[len(STATE):].rpartition(".")
    return (param, name) if param else None


def _wider(a: Entry | None, b: Entry | None) -> bool:
    """Whether ``a`` is a floating dtype wider than ``b``'s (fp32 than bf16)."""
    da, db = a and a.dtype, b and b.dtype
    return da in FLOATS and db in FLOATS and FLOATS.index(str(da)) < FLOATS.index(str(db))


def _describe(e: Entry) -> str:
    return "a value" if e.dtype is None else f"{e.dtype}{list(e.shape)}"


def plan_load(saved: Mapping[str, Entry], mine: Mapping[str, Entry]) -> LoadPlan:
    """How to load a checkpoint holding ``saved`` into a run whose state is ``mine``."""
    skip: set[str] = set()
    convert: set[str] = set()
    to_kahan: list[str] = []
    from_kahan: list[str] = []
    problems: list[str] = []
    for key, want in mine.items():
        have = saved.get(key)
        split = _split_state(key)
        if have is None:
            if key.startswith(GROUPS) and key.rpartition(".")[2] not in HYPERPARAMETERS:
                skip.add(key)  # this optimizer's own flag (amsgrad, fused, ...)
            elif split is not None and split[1] == COMPENSATION:
                weight = MODEL + split[0]
                skip.add(key)
                if _wider(saved.get(weight), mine.get(weight)):
                    to_kahan.append(split[0])
            else:
                problems.append(f"{key}: this run has {_describe(want)}, the checkpoint has none")
            continue
        if (have.dtype is None) != (want.dtype is None) or have.shape != want.shape:
            problems.append(f"{key}: the checkpoint has {_describe(have)}, this run "
                            f"{_describe(want)}")
        elif have.dtype != want.dtype:
            if have.dtype in FLOATS and want.dtype in FLOATS:
                convert.add(key)
            else:
                problems.append(f"{key}: the checkpoint has {_describe(have)}, this run "
                                f"{_describe(want)} (not a floating-point conversion)")
    for key, have in saved.items():
        if key in mine or (key.startswith(GROUPS)
                           and key.rpartition(".")[2] not in HYPERPARAMETERS):
            continue  # another optimizer's flags are not this one's
        split = _split_state(key)
        weight = MODEL + split[0] if split is not None else ""
        if split is not None and split[1] == COMPENSATION and weight in mine:
            if have.shape != mine[weight].shape:
                problems.append(f"{key}: the checkpoint has {_describe(have)}, the weight here "
                                f"is {_describe(mine[weight])}")
            else:
                from_kahan.append(split[0])
        else:
            problems.append(f"{key}: the checkpoint has {_describe(have)}, this run has no such "
                            "entry")
    convert |= {MODEL + p for p in to_kahan}
    return LoadPlan(frozenset(skip), frozenset(convert), tuple(sorted(to_kahan)),
                    tuple(sorted(from_kahan)), tuple(problems))


def incompatible_message(step: int | None, path: str, problems: tuple[str, ...],
                         settings: str) -> str:
    """The failure's one line: which checkpoint, which keys and why, and what to do."""
    named = "; ".join(problems[:MAX_NAMED])
    more = f" (and {len(problems) - MAX_NAMED} more)" if len(problems) > MAX_NAMED else ""
    which = f"checkpoint step {step}" if step is not None else "checkpoint"
    return (f"{which} ({path}) cannot be loaded with this run's settings ({settings}): "
            f"{named}{more}. Nothing was loaded or changed: the checkpoint is kept as it is. "
            "A restart with these settings would fail the same way, and an older "
            "checkpoint or step 0 would lose trained steps, so the run stops here. Resume "
            "it with the settings it was saved with (its config.yaml; under the operator, "
            "turn off the setting the last restart changed, e.g. spec.recovery."
            "allowPrecisionChange), or export it (grpo-train export) and train on from the "
            "exported model; remove its step directories only to start over")
