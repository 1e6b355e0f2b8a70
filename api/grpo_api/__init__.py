"""What the operator and the trainer agree on, at the bottom of both.

Four modules and one subpackage, none of which imports torch, Ray, Kopf or the
Kubernetes client, and none of which imports grpo_operator or grpo_trainer
(tests/unit/test_import_graph.py):

- `grpo_api.job`: the GRPOJob spec and status models (the CRD is generated from them);
- `grpo_api.contract`: env names, exit codes, failure classes, labels, phases, paths;
- `grpo_api.catalog`: the built-in GPU types (the spec names them);
- `grpo_api.knobs`: each planned setting declared once, with all its names;
- `grpo_api.trainer_config`: the trainer's config schema, which the operator renders
  and validates and the trainer loads.
"""

__version__ = "0.1.0"
