"""``grpo-train score-reward``: a job's reward tried on the first rows of its data before
the job runs (on a laptop, in the trainer image, or in an image built FROM it), with the
row's own answer or a response you give as the response."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_api.trainer_config import Config

from ..dataset.index import data_paths, scan
from .forms import RewardResult
from .runner import reward_runner
from .sample import RewardSample, reward_rows


@dataclass(frozen=True)
class Trial:
    where: str  # file and row
    response: str
    result: RewardResult


def score_first_rows(cfg: Config, rows: int, response: str | None) -> list[Trial]:
    """The reward of ``response`` (None: each row's own answer) to each of the first
    ``rows`` rows of data.train_files, scored as the driver scores a step."""
    index = scan(data_paths(cfg.data.train_files, "data.train_files"), "data.train_files",
                 cfg.data)
    refs = [index.ref(i) for i in range(min(rows, len(index)))]
    found = reward_rows(refs, cfg.data, whole=True)
    samples = [RewardSample(response if response is not None else row.ground_truth,
                            len((response if response is not None else row.ground_truth)
                                .split()), row) for row in found]
    runner = reward_runner(cfg.reward)
    try:
        results = runner.score(samples)
    finally:
        runner.close()
    return [Trial(ref.where, s.response, r)
            for ref, s, r in zip(refs, samples, results, strict=True)]
