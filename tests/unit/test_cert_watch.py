"""The webhook certificate's watcher (grpo_operator.cert_watch): unchanged files, or
files briefly missing while a Secret volume swaps them, stop nothing; new contents stop
the operator once, saying why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from grpo_operator.cert_watch import digest, watch_certificate

pytestmark = pytest.mark.unit


def files(tmp_path: Path, text: str) -> list[str]:
    out = []
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text(f"{name} {text}")
        out.append(str(tmp_path / name))
    return out


def test_new_contents_stop_the_operator_once_and_the_same_ones_never(tmp_path: Path) -> None:
    paths = files(tmp_path, "v1")
    stops: list[str] = []

    async def scenario() -> None:
        task = asyncio.create_task(watch_certificate(paths, stops.append, interval=0.02))
        await asyncio.sleep(0.15)
        files(tmp_path, "v1")  # rewritten, same bytes
        Path(paths[1]).unlink()  # mid-swap: unreadable for a moment
        await asyncio.sleep(0.1)
        assert not stops and not task.done()
        files(tmp_path, "v2")  # renewed
        await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
    assert len(stops) == 1 and "was renewed" in stops[0] and "tls.crt" in stops[0]


def test_the_digest_covers_every_file(tmp_path: Path) -> None:
    paths = files(tmp_path, "v1")
    before = digest(paths)
    Path(paths[1]).write_text("another key")
    assert digest(paths) != before and digest(paths[:1]) == digest(paths[:1])
    assert digest([str(tmp_path / "missing")]) is None
