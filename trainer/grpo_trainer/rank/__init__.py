"""What one training rank runs: the worker the driver calls, its policy update, its
GPU memory report, and its weights sent to the rollout engines."""
