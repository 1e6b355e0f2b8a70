"""What a model is, written once for both sides (pure Python, no torch).

The operator's planner predicts the trainer's memory from outside; the trainer sizes its
engines and checks its model from inside. The facts both need live here: the families
the trainer trains (families), a config.json's language-model fields and head size
(config_json), the model's shape in counts (shape), the KV cache's bytes (kv_cache) and
the units bytes are counted in (units). The planner keeps the policy (search, ladders,
headroom, reasons); the trainer keeps the tensors.
"""
