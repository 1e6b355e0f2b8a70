#!/usr/bin/env bash
# Install the operator into a fresh virtualenv exactly as images/operator/Dockerfile
# does: the hash-checked lock first (no resolution, no extras, so no torch), then the
# project itself with --no-deps. tests/unit/test_locks.py runs this same script and
# then `grpo --help` from the result.
#
#   images/operator/install.sh VENV [SRC]      SRC: the repository root (default: .)
# STAGE=deps installs only the lock, STAGE=project only the project (the Dockerfile runs
# them as two layers, so a code change does not reinstall the dependencies).
# Needs `uv` on PATH (or $UV) and CPython 3.11 (or $PYTHON).
set -euo pipefail
venv=${1:?usage: install.sh VENV [SRC]}
src=${2:-.}
uv=${UV:-uv}
stage=${STAGE:-all}
if [ "$stage" != project ]; then
  "$uv" venv --quiet --python "${PYTHON:-python3.11}" "$venv"
  "$uv" pip install --quiet --python "$venv/bin/python" --require-hashes --no-deps --compile-bytecode \
    --only-binary :all: -r "$src/images/operator/requirements.lock"
fi
if [ "$stage" != deps ]; then
  "$uv" pip install --quiet --python "$venv/bin/python" --no-deps \
    --build-constraints "$src/images/build-constraints.txt" "$src"
  # Bytecode, as --compile-bytecode gave the dependencies: the image's user cannot write
  # .pyc into the virtualenv, so without it every process compiles what it imports at each
  # start (docs/benchmarks.md, "Bytecode"). The project's packages only, so this layer
  # stays the project's.
  "$venv/bin/python" -m compileall -q \
    "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/grpo_*
fi
