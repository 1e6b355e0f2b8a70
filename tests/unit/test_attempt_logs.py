"""Every attempt's logs kept on the checkpoint claim: the Ray containers' output also goes
to `<checkpoint dir>/attempts/<n>/<pod name>.log` (render/children.kept_output), and
status.attempts[n].logs says where. The shell prefix runs here for real, in bash, as the
container runs it (`/bin/bash -lc`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef, names
from grpo_operator.render.children import kept_output, render_children
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit
JOB = JobRef("tiny", "team", "uid-1")


def run(prefix: str, command: str, hostname: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", "-lc", prefix + command], capture_output=True,
                          text=True, env={"HOSTNAME": hostname, "PATH": "/usr/bin:/bin"},
                          timeout=30)


def test_the_output_goes_to_the_claim_and_to_the_container_log_with_its_exit_code(
        tmp_path: Path) -> None:
    logs = tmp_path / "team/tiny/attempts/2"
    proc = run(kept_output(str(logs)), "echo step 1; echo oops >&2; exec bash -c 'exit 7'",
               "tiny-a2-head-x7k")
    assert proc.returncode == 7  # the trainer's exit code decides the attempt's class
    assert "step 1" in proc.stdout  # kubectl logs and the termination message's fallback
    kept = (logs / "tiny-a2-head-x7k.log").read_text()
    assert "step 1" in kept and "oops" in kept
    again = run(kept_output(str(logs)), "echo step 2", "tiny-a2-head-x7k")  # a restarted
    assert again.returncode == 0  # container appends to its pod's file
    assert (logs / "tiny-a2-head-x7k.log").read_text().splitlines()[-1] == "step 2"


def test_a_claim_that_cannot_take_the_copy_costs_the_copy_never_the_run(
        tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory would go: mkdir fails
    proc = run(kept_output(str(blocked / "attempts/0")), "echo trained; exit 0", "p")
    assert proc.returncode == 0 and proc.stdout.strip() == "trained"


def test_every_ray_container_keeps_its_output_where_the_attempts_record_says() -> None:
    spec = parse_spec(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    rc = next(c for c in render_children(spec, plan_memory(spec), JOB, 3)
              if c["kind"] == "RayCluster")
    where = names.attempt_logs_dir(JOB, 3)
    assert where == "/checkpoints/team/tiny/attempts/3"
    groups = [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]
    for group in groups:
        (args,) = group["template"]["spec"]["containers"][0]["args"]
        assert args.startswith(kept_output(where)), args
    assert names.attempt_logs(JOB, 3, spec.checkpoint) == \
        "tiny-checkpoints:team/tiny/attempts/3"
