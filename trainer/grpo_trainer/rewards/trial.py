"""``grpo-train score-reward``: a job's reward tried on the first rows of its data before
the job runs (on a laptop, in the trainer image, or in an image built FROM it), with the
row's own answer or a response you give as the response."""

from __future__ import annotations

from dataclasses import dataclass, replace

from grpo_api.trainer_config import Config

from ..dataset.index import data_paths, scan
from ..dataset.rows import RowRef
from .forms import RewardResult
from .runner import reward_runner
from .sample import RewardSample, reward_rows


@dataclass(frozen=True)
class Trial:
    where: str  # file and row
    response: str
    result: RewardResult


def first_refs(cfg: Config, rows: int) -> list[RowRef]:
    """Where the first ``rows`` rows of data.train_files are: the files are scanned one at
    a time until there are enough (a trial reads no file past them), numbered in order."""
    field = "data.train_files"
    refs: list[RowRef] = []
    for path in data_paths(cfg.data.train_files, field):
        index = scan([path], field, cfg.data)
        refs += [replace(index.ref(i), index=len(refs) + i)
                 for i in range(min(rows - len(refs), len(index)))]
        if len(refs) == rows:
            break
    return refs


def score_first_rows(cfg: Config, rows: int, response: str | None) -> list[Trial]:
    """The reward of ``response`` (None: each row's own answer) to each of the first
    ``rows`` rows of data.train_files, scored as the driver scores a step."""
    refs = first_refs(cfg, rows)
    samples = []
    for row in reward_rows(refs, cfg.data, whole=True):
        text = response if response is not None else row.ground_truth
        # Its length in words: a trial loads no tokenizer (the model may not be here).
        samples.append(RewardSample(text, len(text.split()), row))
    runner = reward_runner(cfg.reward)
    try:
        results = runner.score(samples)
    finally:
        runner.close()
    return [Trial(ref.where, s.response, r)
            for ref, s, r in zip(refs, samples, results, strict=True)]
