# The two quick-start commands are `make demo` and `make test` (README.md).
.PHONY: demo test setup testbed lint lock crd

demo: ## set up and run the main job: a tiny GRPOJob that really trains on the testbed
	hack/setup.sh
	.venv/bin/grpo-testbed demo

test: ## install everything and run the whole test suite
	hack/test.sh

setup: ## install Python dependencies and build the testbed
	hack/setup.sh

testbed: ## start the testbed in the foreground (Ctrl-C stops it)
	hack/setup.sh
	.venv/bin/grpo-testbed up

lint:
	.venv/bin/ruff check . && .venv/bin/mypy

lock: ## re-resolve requirements/dev.lock from pyproject.toml (linux x86_64, py3.11)
	.venv/bin/uv pip compile pyproject.toml --extra trainer --extra dev \
	  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	  --no-header --quiet -o requirements/dev.lock

crd: ## regenerate crds/grpojob.yaml and the chart's copy from the pydantic models
	.venv/bin/grpo crd --write
