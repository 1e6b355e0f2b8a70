"""The disaggregated weight sync's wire (rollout/weight_bus.py) on a real gloo group:
rank 0 and two engines as threads of this process, each with its own group handle over
rank 0's store, as the Ray actors have."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from grpo_trainer.rollout.weight_bus import (
    WeightGroupSpec,
    WeightSender,
    join_group,
    receive_weights,
)

pytestmark = pytest.mark.unit


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(6, 4, generator=g)),
        ("layer.bias", torch.randn(4, generator=g)),
        ("big.weight", torch.randn(40, 4, generator=g)),  # 640 bytes: over the bucket
        ("half.weight", torch.randn(3, 2, generator=g).to(torch.bfloat16)),
        ("norm.weight", torch.randn(4, generator=g)),
    ]


def test_every_engine_gets_every_tensor_bit_for_bit_in_order() -> None:
    sender = WeightSender(0)
    port = sender.open(timeout_s=30)
    engines = 2
    spec = WeightGroupSpec("127.0.0.1", port, "weights/1", engines + 1, "gloo", 30)
    received: dict[int, list[tuple[str, torch.Tensor]]] = {}

    def engine(rank: int) -> None:
        pg = join_group(spec, rank)
        received[rank] = [(n, t.clone()) for n, t in receive_weights(pg, torch.device("cpu"))]

    with ThreadPoolExecutor(engines) as pool:
        futures = [pool.submit(engine, r) for r in range(1, engines + 1)]
        sender.join(spec)
        # 128-byte buckets: several tensors share one, the 640-byte one goes alone,
        # the bf16 one starts its own.
        import grpo_trainer.rollout.weight_bus as bus

        sent = bus.send_weights(sender.pg, iter(_weights()), torch.device("cpu"), 128)
        for f in futures:
            f.result(timeout=60)
    want = _weights()
    assert sent == sum(t.numel() * t.element_size() for _, t in want)
    for rank in (1, 2):
        got = received[rank]
        assert [n for n, _ in got] == [n for n, _ in want]
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_new_incarnation_of_the_group_works_on_the_same_store() -> None:
    """After an engine is replaced every member joins a group with a new prefix."""
    sender = WeightSender(0)
    port = sender.open(timeout_s=30)
    for generation in (1, 2):
        spec = WeightGroupSpec("127.0.0.1", port, f"weights/{generation}", 2, "gloo", 30)
        out: list[list[str]] = []

        def engine(s: WeightGroupSpec, got: list[list[str]]) -> None:
            got.append([n for n, _ in receive_weights(join_group(s, 1), torch.device("cpu"))])

        t = threading.Thread(target=engine, args=(spec, out))
        t.start()
        sender.join(spec)
        report = sender.push(iter(_weights()))
        t.join(timeout=60)
        assert report["ok"] and out == [[n for n, _ in _weights()]]


def test_ranks_other_than_0_only_run_the_gather() -> None:
    drained = []

    def stream():  # stands in for the gather every rank runs
        for item in _weights():
            drained.append(item[0])
            yield item

    assert WeightSender(1).push(stream()) == {"ok": True, "bytes": 0}
    assert len(drained) == len(_weights())


ENGINE_PROCESS = """
import sys, time, torch
from grpo_trainer.rollout.weight_bus import WeightGroupSpec, join_group
spec = WeightGroupSpec("127.0.0.1", int(sys.argv[1]), "weights/1", 3, "gloo", 30)
pg = join_group(spec, 2)
print("joined", flush=True)
time.sleep(600)
"""


def test_an_engine_process_killed_before_a_push_fails_it_without_stranding_the_others(
) -> None:
    """A real engine process SIGKILLed: rank 0's push reports the failure instead of
    hanging, and the engine still alive does not wait out the group's timeout."""
    import subprocess
    import sys
    import time

    sender = WeightSender(0)
    port = sender.open(timeout_s=30)
    spec = WeightGroupSpec("127.0.0.1", port, "weights/1", 3, "gloo", 30)
    dead = subprocess.Popen([sys.executable, "-c", ENGINE_PROCESS, str(port)],
                            stdout=subprocess.PIPE, text=True)
    outcome: list[object] = []

    def survivor() -> None:
        pg = join_group(spec, 1)
        joined.set()
        try:
            outcome.append(len(list(receive_weights(pg, torch.device("cpu")))))
        except Exception as err:  # rank 0 closed the group
            outcome.append(err)

    joined = threading.Event()
    thread = threading.Thread(target=survivor, daemon=True)
    try:
        thread.start()
        sender.join(spec)
        assert dead.stdout is not None and dead.stdout.readline().strip() == "joined"
        assert joined.wait(30)
        dead.kill()
        dead.wait(30)
        t0 = time.monotonic()
        report = sender.push(iter(_weights() * 50))
        thread.join(timeout=20)
        assert not thread.is_alive(), "the surviving engine waits for the rest"
        assert not report["ok"] and time.monotonic() - t0 < 20, report
        assert sender.pg is None  # closed: the group is formed again for everyone
        # The survivor got everything or failed at once; either way it is free.
        assert outcome and (isinstance(outcome[0], Exception) or outcome[0] == 250)
    finally:
        dead.kill()
