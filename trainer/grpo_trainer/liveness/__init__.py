"""Is the run alive, and does it stop well: what the trainer tells the operator and does
on its own when a run stalls, leaks or is told to stop.

- ``progress``, ``kube_progress``: step and stage reports (``status.progress``);
- ``stall``, ``stall_monitor``: no progress for the stall timeout -> every rank's stacks,
  exit 6 (Hang);
- ``watchdog``: host and GPU memory per step, monotonic growth flagged;
- ``sigterm``: a checkpoint of the last finished step on SIGTERM, exit 143;
- ``prestop``: the worker pods' preStop hook, which holds Ray up until the driver is done.

Nothing is re-exported: import the module you need.
"""
