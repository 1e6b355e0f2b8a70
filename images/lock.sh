#!/usr/bin/env bash
# Re-resolve the image locks for linux x86_64, CPython 3.11, with exact versions and
# hashes. Needs PyPI; run from anywhere. tests/unit/test_locks.py checks the result.
#
#   images/operator/requirements.lock  the operator's runtime dependencies only (no
#       extras, so no torch), at the versions requirements/dev.lock tests with.
#   images/trainer/requirements.lock   the trainer + gpu extras (torch, vLLM, Ray) plus
#       images/trainer/requirements.in (Ray pinned to contract.RAY_VERSION, flash-attn).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=.venv/bin/uv
common=(--python-version 3.11 --python-platform x86_64-unknown-linux-gnu
        --generate-hashes --no-header --quiet)
"$uv" pip compile pyproject.toml -c requirements/dev.lock "${common[@]}" \
  -o images/operator/requirements.lock
"$uv" pip compile pyproject.toml images/trainer/requirements.in \
  --extra trainer --extra gpu "${common[@]}" -o images/trainer/requirements.lock
echo "wrote images/operator/requirements.lock images/trainer/requirements.lock"
