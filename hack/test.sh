#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, type-check, then every tier
# that runs without a GPU (unit, trainer, vllm, cluster, e2e, images).
#
# With no arguments the tiers run so that a 2-core machine is never idle:
# - the cluster tier waits on a control plane far more than it computes (load ~1.5 while
#   it runs): it runs beside the others, its output shown when it ends;
# - the product's images go into the real node's image store (grpo-testbed node-images:
#   minutes on a fresh machine, much of it disk writes) while the unit, trainer, vLLM and
#   images tiers run; the e2e tier, which needs them there, runs last and alone.
# With arguments they all go to one plain pytest run (e.g. `make test ARGS=tests/unit`
# is `hack/test.sh tests/unit`).
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
hack/setup.sh || exit 1
printf '\n==> ruff\n'; .venv/bin/ruff check . || exit 1
printf '\n==> mypy\n'; .venv/bin/mypy || exit 1

# No `|| true` anywhere: pytest's exit 5 (no tests collected) fails the run as it should.
# The slowest tests are listed, so a run that grows shows where (the cold budget: 60 min).
if [ "$#" -gt 0 ]; then
  printf '\n==> pytest %s\n' "$*"
  .venv/bin/pytest -m "not gpu" --durations=40 "$@"; rc=$?
  echo "test suite finished in $((SECONDS - t_start)) s"
  exit "$rc"
fi

logs=$(mktemp -d -t grpo-test-XXXXXX)
printf '\n==> the real node'"'"'s image store, in the background (%s/node-images.log)\n' "$logs"
.venv/bin/grpo-testbed node-images >"$logs/node-images.log" 2>&1 & importer=$!
printf '==> pytest: the cluster tier, in the background (%s/cluster.log)\n' "$logs"
.venv/bin/pytest -m cluster --durations=15 --basetemp="$logs/cluster-tmp" \
  >"$logs/cluster.log" 2>&1 & cluster=$!

printf '\n==> pytest: unit, trainer, vllm and images tiers\n'
.venv/bin/pytest -m "not gpu and not cluster and not e2e" --durations=30; rc_main=$?

printf '\n==> the cluster tier (it ran beside them)\n'
rc_cluster=0; wait "$cluster" || rc_cluster=$?
cat "$logs/cluster.log"

printf '\n==> the real node'"'"'s image store\n'
rc_import=0; wait "$importer" || rc_import=$?
cat "$logs/node-images.log"
printf '\n==> pytest: the e2e tier\n'
if [ "$rc_import" = 0 ]; then
  .venv/bin/pytest -m e2e --durations=15; rc_e2e=$?
else
  echo "the images could not be imported into the node (exit $rc_import): e2e not run"
  rc_e2e=1
fi

echo "test suite finished in $((SECONDS - t_start)) s: unit/trainer/vllm/images exit" \
  "$rc_main, cluster exit $rc_cluster, e2e exit $rc_e2e"
for rc in "$rc_main" "$rc_cluster" "$rc_e2e"; do
  [ "$rc" = 0 ] || exit "$rc"
done
