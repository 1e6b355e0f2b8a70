"""The GRPO maths and what a step's samples become: advantages and losses, off-policy
corrections, lean log-probs, packing into micro-batches, balancing groups across ranks,
and rollout seeds."""
