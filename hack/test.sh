#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, type-check, then every tier
# that runs without a GPU (unit, trainer, vllm, cluster, e2e, images).
#
# With no arguments the tiers run so that a 2-core machine is never idle:
# - the cluster tier waits on a control plane far more than it computes (load ~1.5 while
#   it runs): it runs beside the others, its output shown when it ends;
# - beside them too, one after another (one real node at a time: the node's image store
#   is one node's at a time, and a second would import 7 GB again): the product's images
#   into the real node's image store (hack/setup.sh imported them beside the Go build;
#   grpo-testbed node-images checks, and imports what a running testbed kept setup from
#   importing); the e2e modules that train nothing (E2E_BESIDE: they wait on probes,
#   restarts and pods, load below 1); then, once the cluster tier has ended (its control
#   planes and the trained pods together would crowd 24 GiB), the e2e modules that train
#   (the tiny jobs, colocated and apart, Kueue preemption, the first job, the quickstart).
#   They used to run last and alone: 31 min of a 86-minute suite, at a load the unit,
#   trainer, vLLM and images tiers left idle. Last in this chain, the vLLM tier: it keeps
#   both cores busy, and the trainer tier's last minutes and the single-threaded unit
#   tier left one idle when it ran after them in the foreground (the suite's tail ran at
#   54-86% busy; docs/benchmarks.md, "Where the suite's CPU goes").
# With arguments they all go to one plain pytest run (e.g. `make test ARGS=tests/unit`
# is `hack/test.sh tests/unit`).
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
hack/setup.sh || exit 1
t_setup=$((SECONDS - t_start))
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

E2E_BESIDE=(tests/e2e/test_node_preload.py tests/e2e/test_operator_liveness.py
            tests/e2e/test_operator_in_cluster.py tests/e2e/test_real_node.py
            tests/e2e/test_model_config_claim.py tests/e2e/test_bad_rows.py
            tests/e2e/test_registry_push.py)
IMPORT_FAILED=90
logs=$(mktemp -d -t grpo-test-XXXXXX)
printf '==> in the background: the cluster tier (%s/cluster.log)\n' "$logs"
# cluster.done, not the pid: an ended child stays a zombie (kill -0 finds it) until `wait`.
# Each background tier writes its seconds to <name>.s: CI shows only the output's tail, and
# the summary at the very end is what says where the time went.
( rc=0; t0=$SECONDS; .venv/bin/pytest -m cluster --durations=15 --basetemp="$logs/cluster-tmp" \
    >"$logs/cluster.log" 2>&1 || rc=$?; echo $((SECONDS - t0)) >"$logs/cluster.s"
  touch "$logs/cluster.done"; exit "$rc" ) & cluster=$!
printf '==> in the background: the real node'"'"'s image store (%s), the e2e modules that' \
  "$logs/node-images.log"
printf ' train nothing (%s), then those that train (%s), then the vLLM tier (%s)\n' \
  "$logs/e2e-beside.log" "$logs/e2e-train.log" "$logs/vllm.log"
ignore=(); for f in "${E2E_BESIDE[@]}"; do ignore+=(--ignore="$f"); done
(
  t0=$SECONDS; rc=0
  if .venv/bin/grpo-testbed node-images >"$logs/node-images.log" 2>&1; then
    echo $((SECONDS - t0)) >"$logs/node-images.s"
    t0=$SECONDS
    .venv/bin/pytest -m e2e --durations=10 --basetemp="$logs/e2e-beside-tmp" "${E2E_BESIDE[@]}" \
      >"$logs/e2e-beside.log" 2>&1 || rc=$?
    echo $((SECONDS - t0)) >"$logs/e2e-beside.s"
    until [ -e "$logs/cluster.done" ]; do sleep 10; done
    t0=$SECONDS
    .venv/bin/pytest -m e2e --durations=15 --basetemp="$logs/e2e-train-tmp" "${ignore[@]}" \
      >"$logs/e2e-train.log" 2>&1 || rc=$?
    echo "$((SECONDS - t0)) (from $((t0 - t_start)) s)" >"$logs/e2e-train.s"
  else
    rc=$IMPORT_FAILED
  fi
  t0=$SECONDS; rc_vllm=0
  .venv/bin/pytest -m vllm --durations=15 --basetemp="$logs/vllm-tmp" >"$logs/vllm.log" 2>&1 \
    || rc_vllm=$?
  echo "$((SECONDS - t0)) (from $((t0 - t_start)) s)" >"$logs/vllm.s"
  echo "$rc_vllm" >"$logs/vllm.rc"
  exit "$rc"
) & e2e=$!

printf '\n==> pytest: unit, trainer and images tiers\n'
# Stopped from outside (CI's time limit): say how far each tier got, last, where the
# output's tail shows it.
on_term() {
  local main="running for $((SECONDS - t0)) s"
  [ -n "${t_main:-}" ] && main="ended in $t_main s"
  echo "terminated after $((SECONDS - t_start)) s: setup $t_setup s, unit/trainer/images" \
    "$main; cluster $(took cluster), node images $(took node-images), e2e that train" \
    "nothing $(took e2e-beside), e2e that train $(took e2e-train), vLLM $(took vllm)" \
    "(? = not ended)"
  exit 143
}
took() { cat "$logs/$1.s" 2>/dev/null || echo "?"; }
trap on_term TERM INT
t0=$SECONDS
.venv/bin/pytest -m "not gpu and not cluster and not e2e and not vllm" --durations=30
rc_main=$?
t_main=$((SECONDS - t0))

printf '\n==> the cluster tier (it ran beside them)\n'
rc_cluster=0; wait "$cluster" || rc_cluster=$?
cat "$logs/cluster.log"

printf '\n==> the real node'"'"'s image store and the e2e modules (they ran beside them)\n'
rc_e2e=0; wait "$e2e" || rc_e2e=$?
cat "$logs/node-images.log"
if [ "$rc_e2e" = "$IMPORT_FAILED" ]; then
  echo "the images could not be imported into the node: e2e not run"
  rc_e2e=1
else
  cat "$logs/e2e-beside.log"
  printf '\n==> the e2e modules that train\n'
  cat "$logs/e2e-train.log"
fi
printf '\n==> the vLLM tier (after the e2e modules)\n'
cat "$logs/vllm.log"
rc_vllm=$(cat "$logs/vllm.rc" 2>/dev/null || echo 1)

echo "test suite finished in $((SECONDS - t_start)) s: unit/trainer/images exit" \
  "$rc_main, cluster exit $rc_cluster, e2e exit $rc_e2e, vllm exit $rc_vllm"
echo "seconds: setup $t_setup; unit/trainer/images $t_main; beside them: cluster" \
  "$(took cluster), node images $(took node-images), e2e that train nothing $(took e2e-beside)," \
  "e2e that train $(took e2e-train), vLLM $(took vllm); load average now" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
for rc in "$rc_main" "$rc_cluster" "$rc_e2e" "$rc_vllm"; do
  [ "$rc" = 0 ] || exit "$rc"
done
