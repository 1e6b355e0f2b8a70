#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, type-check, then every tier
# that runs without a GPU (unit, trainer, vllm, cluster, e2e, images). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
hack/setup.sh
printf '\n==> ruff\n'; .venv/bin/ruff check .
printf '\n==> mypy\n'; .venv/bin/mypy
printf '\n==> pytest (all tiers except gpu)\n'
# No `|| true`: pytest's exit 5 (no tests collected) fails the run as it should.
# The slowest tests, so a run that grows shows where (the cold-run budget is 60 min).
.venv/bin/pytest -m "not gpu" --durations=40 "$@"
echo "test suite finished in $((SECONDS - t_start)) s"
