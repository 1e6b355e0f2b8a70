"""Validation on the held-out split (``data.val_files``), as EasyR1's ``val_freq``.

Which steps validate is a function of the step alone (``ValSchedule``), so a resumed
run keeps the schedule without any saved state. Each rank greedily answers a disjoint
share of the val prompts (``Worker.generate_greedy``: temperature 0, one response per
prompt, the training rollout's engine and batch size); the driver checks that every
prompt was answered exactly once, scores them with the job's reward and reports the
mean. Nothing here draws training randomness: the workers restore their RNG around
the pass and the driver's loader is not touched, so training is the same with
validation on or off.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_api.trainer_config import Config

from ..data import Record
from ..dataset import PromptDataset, RowRef
from ..dataset.lengths import Counter as TokenCounter
from ..rank_api import GreedyGenerator, RankGroup
from ..rewards import RewardResult, RewardRow, RewardRunner, reward_rows, samples_for

# A val prompt as the driver holds it (a ref, read by the rank that answers it) or, in
# tests, a whole record.
Prompt = RowRef | Record


@dataclass(frozen=True)
class ValSchedule:
    interval: int  # 0: never
    before_train: bool  # step 0, i.e. only on a fresh start
    total_steps: int

    def due(self, step: int) -> bool:
        """Validate after ``step`` (0: before the first step)?"""
        if self.interval <= 0:
            return False
        if step == 0:
            return self.before_train
        return step % self.interval == 0 or step == self.total_steps


def shares(count: int, world: int) -> list[range]:
    """Disjoint, contiguous index ranges covering ``count`` items, one per rank, their
    sizes differing by at most one."""
    base, extra = divmod(count, world)
    out: list[range] = []
    start = 0
    for rank in range(world):
        size = base + (1 if rank < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def rank_chunks(records: Sequence[Prompt], world: int, chunk: int
                ) -> list[list[list[Prompt]]]:
    """Each rank's share in chunks of at most ``chunk`` prompts. Every rank gets the same
    number of chunks (trailing ones may be empty): a tensor-parallel engine's ranks must
    make the same calls, whatever their shares."""
    parts = [[records[i] for i in r] for r in shares(len(records), world)]
    n_chunks = max((len(p) + chunk - 1) // chunk for p in parts)
    return [[p[i * chunk : (i + 1) * chunk] for i in range(n_chunks)] for p in parts]


def gather(
    outs: Sequence[Sequence[dict[str, Any]]], records: Sequence[Prompt]
) -> list[dict[str, Any]]:
    """Every rank's responses in ``records`` order; fails unless each record was answered
    exactly once (a lost or doubled prompt would bias the mean unnoticed)."""
    flat = [o for rank_out in outs for o in rank_out]
    counts = Counter(o["index"] for o in flat)
    expected = {r.index for r in records}
    missing = sorted(expected - counts.keys())
    doubled = sorted(i for i, n in counts.items() if n > 1)
    extra = sorted(counts.keys() - expected)
    if missing or doubled or extra:
        raise RuntimeError(
            f"validation answered the val set wrongly: missing {missing[:10]}, "
            f"doubled {doubled[:10]}, unknown {extra[:10]}"
        )
    return sorted(flat, key=lambda o: int(o["index"]))


def summarize(results: Sequence[RewardResult], lengths: Sequence[int]) -> dict[str, float]:
    """The pass's metrics; ``val/accuracy`` only when the reward reports one."""
    m = {
        "val/reward_mean": statistics.fmean(r.score for r in results),
        "val/samples": float(len(results)),
        "val/reward_failed": float(sum(1 for r in results if r.failed)),
        "val/response_length_mean": statistics.fmean(lengths),
    }
    accs = [r.accuracy for r in results if r.accuracy is not None]
    if accs:
        m["val/accuracy"] = statistics.fmean(accs)
    return m


def validation_pass(
    group: RankGroup, records: Sequence[Prompt],
    rows_of: Callable[[Sequence[Prompt]], list[RewardRow]], rewards: RewardRunner, chunk: int,
    step: int,
) -> dict[str, float]:
    """Greedy responses to every val prompt, scored once each: the ``val/`` metrics."""
    t0 = time.perf_counter()
    outs = group.call(GreedyGenerator.generate_greedy,
                      rank_chunks(records, group.world_size, chunk), common=[step])
    responses = gather(outs, records)
    results = rewards.score(samples_for(responses, rows_of(records)))
    m = summarize(results, [int(o["response_tokens"]) for o in responses])
    m["time/val_s"] = time.perf_counter() - t0
    return m


class Validator:
    """The driver's side: the schedule, the val set, the newest result for progress."""

    def __init__(
        self,
        cfg: Config,
        total_steps: int,
        rewards: RewardRunner,
        prompt_tokens: TokenCounter | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        tr = cfg.trainer
        self.schedule = ValSchedule(tr.val_interval_steps, tr.val_before_train, total_steps)
        self.rewards = rewards
        self.data = cfg.data
        self.dataset: PromptDataset | None = None
        self.records: list[RowRef] = []
        if tr.val_interval_steps:
            # Counted in full at load whatever data.prompt_lengths says: a val set is
            # small, and every prompt is answered at each pass.
            self.dataset = PromptDataset(
                cfg.data.val_files, cfg.data.model_copy(update={"prompt_lengths": "eager"}),
                "data.val_files", prompt_tokens, config=cfg, cache_dir=cache_dir)
            self.records = self.dataset.refs()
        # Prompts per rank per engine call: a training rollout's sequences (prompts per
        # rank x rollout.n), which the engine's batch and KV cache are sized for.
        world = cfg.resources.num_workers
        self.chunk = tr.rollout_batch_size // world * cfg.rollout.n
        self.last_step: int | None = None
        self.last_reward: float | None = None

    def maybe_run(self, group: RankGroup, step: int) -> dict[str, float]:
        """The ``val/`` metrics when ``step`` is due, else nothing."""
        if not self.schedule.due(step):
            return {}
        m = validation_pass(group, self.records, self._rows, self.rewards, self.chunk, step)
        self.last_step, self.last_reward = step, m["val/reward_mean"]
        return m

    def _rows(self, prompts: Sequence[Prompt]) -> list[RewardRow]:
        return reward_rows(prompts, self.data, self.rewards.reads_rows)

    def progress(self) -> dict[str, Any]:
        """``Progress`` fields of the newest pass (none before the first)."""
        if self.last_step is None:
            return {}
        return {"val_step": self.last_step, "val_reward_mean": self.last_reward}
