"""The head pod's work and its host memory: Ray's GCS and dashboard, the single-controller
driver, the driver's index of the prompt rows and the length pass that builds it, and the
responses the driver holds for the rewards.

The driver holds no rows: per row a few numbers (``INDEX_BYTES_PER_ROW``, held to by the
trainer's tests), so the index grows with ``spec.data.rows``. Before Ray's ranks start,
the trainer counts every prompt's length in ``length_workers`` processes (the head's CPUs,
at most ``LENGTH_WORKERS_MAX``) when there are ``LENGTH_POOL_MIN_ROWS`` rows or more, each
with the tokenizer and processor loaded (``LENGTH_WORKER_GIB``); a restart reads the kept
result instead.
"""

from __future__ import annotations

from grpo_api.contract import (
    INDEX_BYTES_PER_ROW,
    LENGTH_POOL_MIN_ROWS,
    LENGTH_WORKER_GIB,
    LENGTH_WORKERS_MAX,
)
from grpo_api.model.units import GIB

from .types import Geometry

HEAD_CPUS = 2  # Ray's GCS and raylet, and the driver (rewards score in its threads)
DRIVER_GIB = 6.0  # head: Ray GCS/dashboard + the single-controller driver
DRIVER_CPU_GIB = 3.0  # the same for a tiny cpu job (small batches, no vLLM)
# spec.data.rows unset: the rows a head is sized for (docs/configuration.md); a CPU job's
# head (a test's or a demo's data, beside the ranks on one small node) for fewer.
DEFAULT_DATA_ROWS = 1_000_000
DEFAULT_CPU_DATA_ROWS = 10_000
# The driver holds a step's responses as text for the rewards (rollout summaries): bytes
# of a Python str per response token (about 4 characters a token, 1 byte each, and the
# summary's dict around it).
RESPONSE_TEXT_B_PER_TOKEN = 8


def data_rows(geo: Geometry) -> int:
    """The rows the head's index is sized for: spec.data.rows, else the default."""
    if geo.data_rows:
        return geo.data_rows
    return DEFAULT_DATA_ROWS if geo.is_gpu else DEFAULT_CPU_DATA_ROWS


def head_cpus(geo: Geometry) -> int:
    """The head pod's CPUs: Ray and the driver, and the ranks where it runs them."""
    cpus = HEAD_CPUS
    if geo.nodes == 0:  # the head is the only pod: it also runs the ranks
        cpus = max(cpus, geo.ranks_per_node + 2)
    return min(cpus, geo.cpus_per_node)


def length_workers(geo: Geometry) -> int:
    """Processes of the trainer's length pass (rendered as data.length_workers): the
    head's CPUs for a GPU job; 1 (the driver alone, no pool) for a CPU job, whose head
    also runs the ranks and whose data is a test's."""
    if not geo.is_gpu:
        return 1
    return max(1, min(head_cpus(geo), LENGTH_WORKERS_MAX))


def head_terms(geo: Geometry) -> dict[str, float]:
    """GiB the head's processes hold at their peak, by term."""
    rows = data_rows(geo)
    terms = {
        "ray_and_driver": DRIVER_GIB if geo.is_gpu else DRIVER_CPU_GIB,
        "row_index": rows * INDEX_BYTES_PER_ROW / GIB,
    }
    # A step's responses, and with rollouts apart those of the batches drawn ahead.
    ahead = 1 + (geo.rollout.max_staleness if geo.rollout is not None else 0)
    terms["responses_in_flight"] = (geo.rollout_batch_size * geo.spec_rollout_n
                                    * geo.response_length * RESPONSE_TEXT_B_PER_TOKEN
                                    * ahead / GIB)
    if (geo.prompt_lengths == "eager" and length_workers(geo) > 1
            and rows >= LENGTH_POOL_MIN_ROWS):
        terms["length_pass"] = length_workers(geo) * LENGTH_WORKER_GIB
    return terms


def driver_gib(geo: Geometry) -> float:
    """The head pod's Ray processes and the driver, with its index and length pass."""
    return sum(head_terms(geo).values())
