"""The project's test kit: tiny real models built without network access, stand-ins for
what a test cannot reach (a hub), fault probes and checks the trainer, vLLM, e2e tiers
and the benchmarks share. Its own package, never shipped: the images leave testkit/ out
of their build context, and no shipped module imports it (tests/unit/test_import_graph.py).
The tiny models a user builds with `grpo-train make-tiny` are the product's
(grpo_trainer.tiny); this kit builds on them."""
