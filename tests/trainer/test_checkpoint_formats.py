"""Checkpoint digests and the direct reader, on one in-process rank (no Ray).

New saves record xxh3-128 digests; checkpoints written before that (format 1, sha256
under the key "sha256") still verify and load. Whatever the algorithm, a flipped byte
is caught before any of the checkpoint reaches the model or the optimizer, and what
the direct reader puts in place is bit for bit what was saved.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.configs import text_config
from grpo_testkit.crash import LocalGroup
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.checkpointing.tracker import MANIFEST
from grpo_trainer.config import Config, build_config
from grpo_trainer.driver.driver import GRPOTrainer

pytestmark = pytest.mark.trainer


class Rig:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.trainer = GRPOTrainer(cfg)
        self.group = LocalGroup(cfg)
        self.worker = self.group.workers[0]

    def state(self) -> dict[str, torch.Tensor]:
        """Every parameter and Adam moment of the rank, copied."""
        out = {f"p/{n}": p.detach().to_local().clone() for n, p in self._params()}
        for n, p in self._params():
            for k, v in self.worker.state.optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    t = v.to_local() if hasattr(v, "to_local") else v
                    out[f"o/{n}/{k}"] = t.detach().clone()
        return out

    def _params(self) -> list[tuple[str, Any]]:
        return list(self.worker.state.actor.named_parameters())

    def perturb(self) -> None:
        """One optimizer step on random gradients: every tensor of the state changes."""
        for _, p in self._params():
            p.grad = torch.randn_like(p) * 1e-2
        self.worker.state.optimizer.step()
        self.worker.state.optimizer.zero_grad(set_to_none=True)

    def save(self, step: int) -> Path:
        DCPCheckpointer(self.cfg).maybe_save(step, self.group, self.trainer.loader, final=True)
        return Path(str(self.cfg.checkpoint.dir)) / f"step-{step}"

    def restore(self) -> tuple[int, dict[str, float]]:
        ck = DCPCheckpointer(self.cfg)
        step = ck.restore(self.group, self.trainer.loader)
        return step, ck.last_restore


@pytest.fixture(scope="module")
def rig(tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("formats")
    raw = text_config(
        tiny_lm,
        write_text_task(tmp / "t.jsonl"),
        checkpoint={"dir": str(tmp / "ckpt"), "keep": 5, "interval_steps": 1},
        resources={"num_workers": 1, "cpus_per_worker": 2},
    )
    r = Rig(build_config(raw, environ={}))
    r.perturb()  # real Adam moments
    yield r
    r.group.shutdown()
    r.trainer.close()


def _clear(rig: Rig) -> None:
    root = Path(str(rig.cfg.checkpoint.dir))
    for p in sorted(root.glob("**/*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def _as_format_1(step_dir: Path) -> None:
    """Rewrite a manifest as saves before the xxh3 switch wrote it: sha256, no algorithm."""
    m = json.loads((step_dir / MANIFEST).read_text())
    old = {
        "format": 1,
        "step": m["step"],
        "world_size": m["world_size"],
        "created_at": m["created_at"],
        "files": {
            name: {
                "size": f["size"],
                "sha256": hashlib.sha256((step_dir / name).read_bytes()).hexdigest(),
            }
            for name, f in m["files"].items()
        },
    }
    (step_dir / MANIFEST).write_text(json.dumps(old, indent=1))


def test_a_save_loads_back_bit_for_bit_through_the_direct_reader(rig: Rig) -> None:
    _clear(rig)
    saved = rig.state()
    step_dir = rig.save(1)
    assert json.loads((step_dir / MANIFEST).read_text())["algorithm"] == "xxh3_128"
    rig.perturb()
    assert any(not torch.equal(v, rig.state()[k]) for k, v in saved.items())
    step, info = rig.restore()
    assert step == 1
    now = rig.state()
    assert saved.keys() == now.keys()
    for k, v in saved.items():
        assert torch.equal(v, now[k]), k
    # The weights and both moments went straight into place, not through torch.load.
    assert info["direct_items"] >= len([k for k in saved if k.startswith("o/")])


def test_a_sha256_checkpoint_from_before_the_switch_still_loads(rig: Rig) -> None:
    _clear(rig)
    saved = rig.state()
    _as_format_1(rig.save(1))
    rig.perturb()
    step, _ = rig.restore()
    assert step == 1
    for k, v in rig.state().items():
        assert torch.equal(v, saved[k]), k


@pytest.mark.parametrize("old_format", [False, True], ids=["xxh3", "sha256"])
def test_a_flipped_byte_is_caught_before_any_state_is_touched(
    rig: Rig, old_format: bool, caplog: pytest.LogCaptureFixture
) -> None:
    _clear(rig)
    good = rig.save(1)
    rig.perturb()
    bad = rig.save(2)
    if old_format:
        _as_format_1(good)
        _as_format_1(bad)
    shard = max(bad.glob("*.distcp"), key=lambda p: p.stat().st_size)
    _flip(shard)
    caplog.set_level(logging.INFO, logger="grpo_trainer")

    step, _ = rig.restore()
    assert step == 1  # skipped for the one before it
    algorithm = "sha256" if old_format else "xxh3_128"
    assert f"checkpoint {bad} is corrupt" in caplog.text
    assert f"{shard.name} has {algorithm}" in caplog.text

    # The only checkpoint is the damaged one: nothing of it may reach the state.
    _clear(rig)
    rig.perturb()
    rig.save(3)
    before = rig.state()
    rig.perturb()
    _flip(
        max(
            (Path(str(rig.cfg.checkpoint.dir)) / "step-3").glob("*.distcp"),
            key=lambda p: p.stat().st_size,
        )
    )
    expected = rig.state()
    assert any(not torch.equal(v, before[k]) for k, v in expected.items())
    step, _ = rig.restore()
    assert step == 0
    for k, v in rig.state().items():
        assert torch.equal(v, expected[k]), k
