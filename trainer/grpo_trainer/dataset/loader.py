"""Endless batches of row refs over a prompt set; each epoch a fresh seeded permutation.

The tail of an epoch that does not fill a batch is dropped, so every step sees the same
number of prompts. The state is three integers, cheap to checkpoint: a resumed run
draws the very next batch. With a ``check`` (lazy prompt lengths) the rows it rejects
are passed over and the batch filled from the rows after them; the check is a pure
function of the row, so a resumed run passes over the same ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..config_error import ConfigError
from .prompts import PromptDataset
from .rows import RowRef

Check = Callable[[Sequence[RowRef]], list[bool]]


class StatefulLoader:
    def __init__(self, dataset: PromptDataset, batch_size: int, seed: int, shuffle: bool,
                 check: Check | None = None) -> None:
        if batch_size > len(dataset):
            raise ConfigError(
                "trainer.rollout_batch_size",
                f"{batch_size} prompts per step but the dataset has only {len(dataset)}",
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.check = check
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.offset = 0
        self._order = self._permutation(self.epoch)

    def next_batch(self) -> list[RowRef]:
        if self.offset + self.batch_size > len(self._order):
            self._new_epoch()
        if self.check is None:
            idx = self._order[self.offset : self.offset + self.batch_size]
            self.offset += self.batch_size
            return [self.dataset.ref(int(i)) for i in idx]
        return self._checked_batch()

    def _checked_batch(self) -> list[RowRef]:
        assert self.check is not None
        got: list[RowRef] = []
        restarted = False
        while len(got) < self.batch_size:
            want = self.batch_size - len(got)
            if self.offset + want > len(self._order):  # this epoch cannot fill it
                if restarted:
                    raise ConfigError(
                        self.dataset.field,
                        f"fewer than {self.batch_size} prompts of the data pass the checks "
                        "(see the dropped and skipped rows logged above)")
                self._new_epoch()
                got, restarted = [], True
                continue
            refs = [self.dataset.ref(int(i))
                    for i in self._order[self.offset : self.offset + want]]
            self.offset += want
            got += [r for r, ok in zip(refs, self.check(refs), strict=True) if ok]
        return got

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self._order = self._permutation(self.epoch)
