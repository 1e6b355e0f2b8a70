"""A dataset with a corrupt image, on the testbed's real node: with the default
``spec.data.badRows: fail`` the job fails at load, before any rank starts, naming the file
and the row (a ConfigError: no restart is spent on it). The ``skip`` side runs in the main
job (tests/e2e/test_tiny_job.py: its dataset has such a row, and it succeeds counting it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.processes import wait_until
from grpo_testbed.tiny_job import JOB_NS, TinyJob, example, tiny_job_testbed
from grpo_testkit.datasets import NOT_AN_IMAGE, write_with_corrupt_image

pytestmark = pytest.mark.e2e

NAME = "bad-rows"
BAD_ROW = 3
BAD_FILE = "/models/tiny-data/train-bad.parquet"


def job_status(tj: TinyJob) -> dict[str, Any]:
    out = tj.tb.kubectl("get", "grpojob", NAME, "-n", JOB_NS, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


@pytest.fixture(scope="module")
def tj(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    work = tmp_path_factory.mktemp("bad-rows")
    with tiny_job_testbed(work) as tj:
        try:
            tj.install_chart()
            root = tj.build_assets()
            bad = root / Path(BAD_FILE).relative_to("/models")
            write_with_corrupt_image(tj.data_file(), bad, BAD_ROW)
            bad.chmod(0o644)
            doc = example()
            doc["metadata"]["name"] = NAME
            doc["spec"]["data"]["train"] = BAD_FILE
            manifest = work / f"{NAME}.yaml"
            manifest.write_text(yaml.safe_dump(doc))
            tj.tb.kubectl("apply", "-n", JOB_NS, "-f", str(manifest))
            yield tj
        finally:
            tj.tb.kubectl("delete", "grpojob", NAME, "-n", JOB_NS, "--ignore-not-found",
                          "--wait=true", "--timeout=60s", check=False)


def test_a_corrupt_image_fails_the_job_at_load_naming_the_file_and_row(tj: TinyJob) -> None:
    try:
        wait_until(f"{NAME} Failed", lambda: job_status(tj).get("phase") == "Failed", 600,
                   interval_s=2.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {job_status(tj)}\noperator log:\n"
                             f"{tj.operator_log()}") from None
    st = job_status(tj)
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ConfigError", st
    assert (f"data.bad_rows: {BAD_FILE} row {BAD_ROW}: image 1 is not an image that can be "
            f"read (UnidentifiedImageError, {len(NOT_AN_IMAGE)} bytes)") in failed["message"], \
        failed
    assert "set data.bad_rows (spec.data.badRows) to skip" in failed["message"]
    assert st.get("restarts", 0) == 0 and len(st["attempts"]) == 1, st
    assert st["attempts"][0].get("lastCheckpointStep") is None  # no step ran
