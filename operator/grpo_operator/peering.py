"""Which replica of a Kopf peering reconciles: the oldest live one.

Kopf (1.45.2, kopf/_core/engines/peering.py) pauses an operator while a live peer of
higher priority is in its peering object, and pauses EVERY operator whose top priority
is shared: two replicas of equal priority would both stand by. So each replica needs a
priority of its own. Ranking by start time (older is higher) means a newcomer (a rolling
update's new pod, the replacement of a killed pod) never preempts the replica that is
reconciling: the active replica changes only when it leaves, gracefully (it removes
itself from the peering at once) or not (it is dead once its keep-alive is older than
the peering lifetime). Every replica serves the admission webhooks either way.
"""

from __future__ import annotations

# Replicas started within the same millisecond are told apart by a random salt below
# this bound; the product of both stays far inside the int64 the peering status holds.
SALT_RANGE = 1024

# Seconds a replica's keep-alive stays valid in the peering (Kopf's default is 60). Kopf
# renews it every lifetime minus 5-10 s, so a killed active replica is taken over
# between 5 s and this long after its death. Under 10, Kopf would renew every second.
PEERING_LIFETIME_S = 15
MIN_PEERING_LIFETIME_S = 10


def replica_priority(started_at_s: float, salt: int) -> int:
    """The peering priority of a replica started at `started_at_s` (Unix seconds):
    the earlier, the higher; `salt` (0 <= salt < SALT_RANGE, random per replica) breaks
    ties. Negative, so that an operator run by hand at Kopf's usual priorities (0, or
    `kopf run --dev`'s 666) outranks the deployed replicas, as it did before."""
    if not 0 <= salt < SALT_RANGE:
        raise ValueError(f"salt must be in [0, {SALT_RANGE}), got {salt}")
    return -(int(started_at_s * 1000) * SALT_RANGE + salt)
