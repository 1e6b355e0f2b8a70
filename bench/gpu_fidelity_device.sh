#!/usr/bin/env bash
# bench/gpu_fidelity.py on a lent GPU machine, in one call (docs/benchmarks.md, "GPU fidelity").
#
#   bench/gpu_fidelity_device.sh fetch   here, once: the pure-Python wheels the GPU machine
#                                        lacks, for its Python 3.12, into .whl/ (git-ignored)
#   bench/gpu_fidelity_device.sh run     there, with .whl carried: installs them, prints the
#                                        card and driver, runs the first checks
#                                        (gpu_first_checks.py), then every case under a time
#                                        limit, and leaves first_checks.json, gpu_fidelity.json,
#                                        their .log and nvidia-smi.txt in $OUT
#
# That machine has torch, transformers, PyYAML and Jinja2 but no pydantic, Ray or vLLM, and
# no network. The versions are the GPU trainer image's lock, so the planner and the trainer
# config are validated there as in the image.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions)
LOCK=images/trainer/requirements.lock
SITE=/tmp/gpu-fidelity-site

fetch() {
    local pins=() name pin
    for name in "${WHEELS[@]}"; do
        pin=$(grep -oiE "^${name}==[^ ]+" "$LOCK") || { echo "$LOCK pins no $name" >&2; exit 1; }
        pins+=("$pin")
    done
    rm -rf .whl
    "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "${pins[@]}"
    ls -l .whl
}

run() {
    : "${OUT:?run this on the device machine: \$OUT is where its results go}"
    ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run '$0 fetch' here and carry .whl" >&2; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || exit 1
    export PYTHONPATH="$SITE:$PWD/api:$PWD/operator:$PWD/trainer:$PWD/testkit" PYTHONUNBUFFERED=1
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv \
        | tee -a "$OUT/nvidia-smi.txt"
    python3 -c 'import sys, torch, transformers, pydantic; print("python", sys.version.split()[0],
        "torch", torch.__version__, "cuda", torch.version.cuda, "transformers",
        transformers.__version__, "pydantic", pydantic.VERSION)' | tee -a "$OUT/nvidia-smi.txt"
    # First the checks only a GPU can make (the packed mask's alignment, a text-only
    # micro-batch beside an image one, vLLM's runner): under a minute.
    timeout -k 10 "${FIRST_CHECKS_TIMEOUT_S:-90}" python3 bench/gpu_first_checks.py \
        --out "$OUT/first_checks.json" 2>&1 | tee "$OUT/first_checks.log"
    # The bench starts no case after --budget-s; the hard limit leaves the device call's
    # 540 s (timeout_s) room for the first checks, the install and the copy back.
    timeout -k 10 "${FIDELITY_TIMEOUT_S:-390}" python3 bench/gpu_fidelity.py \
        --budget-s "${FIDELITY_BUDGET_S:-320}" --out "$OUT/gpu_fidelity.json" "$@" 2>&1 \
        | tee "$OUT/gpu_fidelity.log"
}

case "${1:-}" in
    fetch) fetch ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 fetch | run [gpu_fidelity.py arguments]" >&2; exit 2 ;;
esac
