"""The driver: the step loop, the group of ranks it calls, the rollout pipeline apart,
validation, and the metrics it reports."""
