"""Crash safety: SIGKILL real trainers at random moments, many inside a save (and, with
checkpoint.store, once between a step's files reaching the store and its manifest).

Each attempt is a real training process (forked from ``grpo_testkit.crash``,
which imported torch once) running the real driver loop, checkpointer and worker
on one gloo rank; the test kills it with SIGKILL at a random moment or shortly
after a save has begun, then starts the next attempt on the same directory. Every
attempt must resume from exactly the step the tracker named when the previous one
died, never meet a corrupt checkpoint, print the same per-step metrics as an
uninterrupted run, and every run that finishes must end with bit-identical weights.
The same server trains a tiny VLM for the export test (no Ray needed there).
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpo_testkit.crash import CrashServer, crash_run_config, step_metrics
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import committed_step, read_tracker, scan
from grpo_trainer.checkpointing.export import load_model_tensors

pytestmark = pytest.mark.trainer

TOTAL_STEPS = 4
KILLS = 20


@pytest.fixture(scope="module")
def server() -> Iterator[CrashServer]:
    s = CrashServer()
    yield s
    s.close()


def _dirs(root: Path) -> set[tuple[int, int, int]]:
    """Step directories with their identity (inode, ctime): a re-created one is new."""
    out = set()
    for step in scan(root):
        try:
            st = (root / f"step-{step}").stat()
        except FileNotFoundError:
            continue
        out.add((step, st.st_ino, st.st_ctime_ns))
    return out


def _saving(root: Path, before: set[tuple[int, int, int]]) -> bool:
    """This attempt has a save under way: a step directory it created, newer than the
    tracker (leftovers of the attempt before do not count)."""
    if not root.is_dir():
        return False
    tracker = read_tracker(root)
    latest = tracker.step if tracker else 0
    return any(d[0] > latest and d not in before for d in _dirs(root))


def _assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = load_model_tensors(a), load_model_tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_sigkill_anywhere_resumes_from_a_complete_checkpoint_and_matches(
    server: CrashServer, tiny_lm: Path, tmp_path: Path
) -> None:
    t_start = time.monotonic()
    data = write_text_task(tmp_path / "t.jsonl")
    ref_cfg = crash_run_config(tmp_path, tiny_lm, data, "ref", steps=TOTAL_STEPS)
    server.start(ref_cfg, tmp_path / "ref.log")
    assert server.wait() == 0, (tmp_path / "ref.log").read_text()[-3000:]
    t_ref = time.monotonic() - server.started
    ref_metrics = step_metrics(tmp_path / "ref.log")
    assert sorted(ref_metrics) == list(range(1, TOTAL_STEPS + 1))
    ref_final = tmp_path / "ref" / f"step-{TOTAL_STEPS}"
    # How long a save takes here, so that aimed kills land inside one on any machine.
    save_s = statistics.median(
        float(x)
        for x in re.findall(r"committed: .* in ([0-9.]+) s", (tmp_path / "ref.log").read_text())
    )

    rng = random.Random(20261122)
    kills: list[dict[str, Any]] = []
    finished: list[Path] = []
    attempt = 0
    chain = 0
    while len(kills) < KILLS:  # then the run in progress goes on to the end unharmed
        chain += 1
        name = f"chain-{chain}"
        cfg = crash_run_config(tmp_path, tiny_lm, data, name, steps=TOTAL_STEPS,
                               async_save=chain % 2 == 0)
        root = tmp_path / name
        while True:
            attempt += 1
            expect = committed_step(root)
            log = tmp_path / f"attempt-{attempt}.log"
            before = _dirs(root) if root.is_dir() else set()
            server.start(cfg, log)
            aim = "save" if rng.random() < 0.7 else "random"
            if len(kills) >= KILLS:
                aim = "none"
            delay = rng.uniform(0.0, t_ref) if aim == "random" else rng.uniform(0.0, save_s)
            # Aimed kills wait for this attempt to commit one step first, so every
            # run moves forward and the kills spread over all of its saves.
            armed = False
            seen_save_at: float | None = None
            status = None
            while status is None:
                status = server.poll()
                now = time.monotonic()
                if status is not None:
                    break
                if aim == "save":
                    if not armed:
                        armed = (committed_step(root) or 0) > (expect or 0)
                    elif seen_save_at is None and _saving(root, before):
                        seen_save_at = now
                    if seen_save_at is not None and now - seen_save_at >= delay:
                        break
                elif aim == "random" and now - server.started >= delay:
                    break
                time.sleep(0.005)
            killed = False
            if status is None:
                killed = server.kill()
                status = server.wait()
            text = log.read_text()
            assert "corrupt" not in text, text[-3000:]
            assert "Traceback" not in text, text[-3000:]
            # It resumed from exactly what the tracker named when the last attempt died.
            if expect is None:
                assert "resumed from" not in text
            elif "resumed from" in text or status == 0:
                assert f"resumed from checkpoint step {expect} " in text, text[-3000:]
            for step, m in step_metrics(log).items():
                assert m == ref_metrics[step], f"attempt {attempt} step {step} differs"
            if killed and status == -9:
                kills.append(
                    {
                        "attempt": attempt,
                        "aim": aim,
                        "after_s": round(time.monotonic() - server.started, 2),
                        "in_save": _saving(root, before),
                        "tracker": expect,
                    }
                )
                continue
            assert status == 0, text[-3000:]
            _assert_same_weights(root / f"step-{TOTAL_STEPS}", ref_final)
            finished.append(root)
            break

    in_save = sum(k["in_save"] for k in kills)
    print(
        f"\n{len(kills)} SIGKILLs over {attempt} attempts in {chain} runs "
        f"({len(finished)} finished, all bit-identical to the uninterrupted run); "
        f"{in_save} kills landed inside a save; "
        f"{time.monotonic() - t_start:.0f} s in all (uninterrupted run {t_ref:.1f} s, "
        f"median save {save_s:.2f} s)"
    )
    for k in kills:
        print(f"  {k}")
    assert in_save >= 5

    # A flipped byte (same size) in the newest checkpoint: caught by its xxh3 digest,
    # named in the log, skipped for the previous one; the run redoes the step.
    root = finished[-1]
    shard = max((root / f"step-{TOTAL_STEPS}").glob("*.distcp"), key=lambda p: p.stat().st_size)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    log = tmp_path / "flipped.log"
    server.start(cfg, log)
    assert server.wait() == 0
    text = log.read_text()
    assert f"checkpoint {root / f'step-{TOTAL_STEPS}'} is corrupt" in text
    assert shard.name in text and "has xxh3_128" in text
    assert f"resumed from checkpoint step {TOTAL_STEPS - 1} " in text
    _assert_same_weights(root / f"step-{TOTAL_STEPS}", ref_final)

    # --no-resume on a finished run's directory starts over and replaces it.
    log = tmp_path / "no-resume.log"
    server.start(cfg, log, resume=False)
    assert server.wait() == 0
    text = log.read_text()
    assert "not resuming" in text and "resumed from" not in text
    assert sorted(step_metrics(log)) == list(range(1, TOTAL_STEPS + 1))
    _assert_same_weights(root / f"step-{TOTAL_STEPS}", ref_final)


def test_a_vlm_checkpoint_exports_to_a_loadable_hf_directory(
    server: CrashServer, tiny_vlm: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grpo_testkit.datasets import write_vision_task
    from grpo_trainer.checkpointing.export import export

    data = write_vision_task(tmp_path / "v.parquet")
    cfg = {
        "model": {"path": str(tiny_vlm)},
        "data": {"train_files": [str(data)], "format_prompt": "math"},
        "rollout": {"n": 4, "max_new_tokens": 6},
        "actor": {"lr": 1e-3, "micro_batch_size": 4, "dtype": "float32"},
        "reward": {"type": "math"},
        "resources": {"num_workers": 1},
        "trainer": {"total_steps": 1, "rollout_batch_size": 2},
        "metrics": {"progress_bar": "off"},
        "checkpoint": {"dir": str(tmp_path / "ckpt")},
    }
    (tmp_path / "vlm.yaml").write_text(yaml.safe_dump(cfg))
    server.start(tmp_path / "vlm.yaml", tmp_path / "vlm.log")
    assert server.wait() == 0, (tmp_path / "vlm.log").read_text()[-3000:]

    done = export(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    assert done.step == 1
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf")
    assert AutoProcessor.from_pretrained(tmp_path / "hf") is not None
    exported = model.state_dict()
    saved = load_model_tensors(tmp_path / "ckpt" / "step-1")
    assert saved.keys() == exported.keys()
    assert any("visual" in k for k in saved)
    for k, v in saved.items():
        assert torch.equal(exported[k], v), k


def test_sigkill_mid_upload_leaves_a_step_the_resume_never_loads(
        tiny_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint.store: a real SIGKILL of a training process after its rank's files of a
    step are in the store but before the manifest that makes the step count (the store is
    watched, and the kill lands in that window). A new pod (an empty local directory)
    resumes from the newest complete step, never the cut one, removes the cut one's
    objects, and finishes with every step in the store whole."""
    from grpo_testbed.s3_server import REGION, standalone_s3_server
    from grpo_trainer.checkpointing.tracker import MANIFEST

    s3 = standalone_s3_server(tmp_path / "s3")
    try:
        s3.make_bucket("ckpt")
        # The fork server's children read the keys from its environment, as ranks in a pod.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
        crash = CrashServer()
        try:
            data = write_text_task(tmp_path / "t.jsonl")
            store = {"uri": "s3://ckpt/cut", "endpoint": s3.endpoint, "region": REGION,
                     "path_style": True}
            prefix = s3.root / "ckpt" / "cut"

            def config(name: str) -> Path:
                path = crash_run_config(tmp_path, tiny_lm, data, name, steps=TOTAL_STEPS)
                raw = yaml.safe_load(path.read_text())
                raw["checkpoint"]["store"] = store
                path.write_text(yaml.safe_dump(raw))
                return path

            def cut() -> int | None:
                """A step whose files are in the store and whose manifest is not."""
                for step in sorted(scan(prefix)) if prefix.is_dir() else []:
                    d = prefix / f"step-{step}"
                    if any(d.glob("*.distcp")) and not (d / MANIFEST).exists():
                        return step
                return None

            crash.start(config("pod-a"), tmp_path / "a.log")
            caught, status = None, None
            while caught is None and status is None:
                status = crash.poll()
                caught = cut()
                time.sleep(0.002)
            assert caught is not None, "the run ended before a step was half in the store"
            assert crash.kill(), "the process had ended"
            crash.wait()
            assert cut() == caught  # the kill left it so, for real
            crash.start(config("pod-b"), tmp_path / "b.log")
            assert crash.wait() == 0, (tmp_path / "b.log").read_text()[-3000:]
        finally:
            crash.close()
        log = (tmp_path / "b.log").read_text()
        resumed = re.search(r"resumed from checkpoint step (\d+)", log)
        start = int(resumed.group(1)) if resumed else 0
        assert start < caught, (start, caught, log[-2000:])
        assert sorted(step_metrics(tmp_path / "b.log")) == list(range(start + 1,
                                                                      TOTAL_STEPS + 1))
        for step in scan(prefix):  # every step left in the store is whole
            assert (prefix / f"step-{step}" / MANIFEST).is_file(), step
    finally:
        s3.stop()
