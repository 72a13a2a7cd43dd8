"""A worker's lease that lapsed while the worker still ran the instance (found with the support escalation of
tests/engine/support_o44/: the first model call of a worker imports litellm, and a stall of the whole process
longer than the lease, ``--idle-ms 1000``, let it run out).

Before: the heartbeat marked the lease lost and never took it again, though nobody else held it. For the
rest of the activity (the model call) ``layerflow list`` showed the running instance held by nobody, and
another worker that took the entry over (idle past ``--idle-ms``) got the free lease and ran the same model
step a second time beside the live worker ("taken over from consumer 'w2', which did not finish it"), whose
save then refused the taker's. The heartbeat now takes a lapsed lease that nobody took straight back; the
check before the next activity still refuses to go on when someone saved the instance meanwhile.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from context_layers.stores import open_store
from engine.leases import Heartbeat, LeaseLost
from tests.engine.engine_helpers import redis_scratch

REDIS = "redis://127.0.0.1:6379/10"


@pytest.fixture
def store() -> Iterator[object]:
    with redis_scratch(REDIS, "o44lease") as prefix:
        yield open_store(f"{REDIS}?prefix={prefix}")


def _stall(seconds: float) -> None:
    """Hold the interpreter as a long import does: no other thread (the heartbeat) runs meanwhile."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds * 4)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(before)


def test_a_lease_that_ran_out_during_a_stall_is_taken_back_while_nobody_holds_it(store) -> None:
    assert store.acquire_lease("t1", "w2", 0.3)
    beat = Heartbeat(store, "t1", "w2", 0.3)
    try:
        _stall(0.8)                                        # the lease's 0.3 s run out meanwhile
        time.sleep(0.3)                                    # the heartbeat's next beats
        assert store.lease_owner("t1") == "w2"             # `list`: held by w2, as it is
        assert not store.acquire_lease("t1", "w1", 0.3)    # no other worker takes it over
        beat.check("next_step", lambda: True)              # nobody saved: w2 goes on
    finally:
        beat.stop()


def test_a_lease_taken_back_after_a_stall_still_stops_the_worker_when_someone_saved_meanwhile(store) -> None:
    assert store.acquire_lease("t2", "w2", 0.3)
    beat = Heartbeat(store, "t2", "w2", 0.3)
    try:
        _stall(0.8)
        time.sleep(0.3)
        with pytest.raises(LeaseLost, match="t2"):
            beat.check("next_step", lambda: False)          # another saved the instance in the gap
        assert store.lease_owner("t2") is None              # given up: whoever goes on takes it
    finally:
        beat.stop()


class _Held:
    """The heartbeat's view of the store, held shut as a stall holds it: no beat reaches Redis until
    ``gate`` opens. (A stall of the interpreter cannot order a beat after another worker's claim: once
    it ends, the heartbeat may beat first and take back the lease nobody holds, as it should.)"""

    def __init__(self, store: object) -> None:
        import threading

        self._store, self.gate = store, threading.Event()

    def __getattr__(self, name: str) -> object:
        method = getattr(self._store, name)

        def held(*args: object, **kwargs: object) -> object:
            self.gate.wait(10)
            return method(*args, **kwargs)
        return held


def test_a_lease_someone_else_took_during_the_stall_stays_theirs(store) -> None:
    assert store.acquire_lease("t3", "w2", 0.3)
    held = _Held(store)
    beat = Heartbeat(held, "t3", "w2", 0.3)
    try:
        time.sleep(0.8)                                     # no beat gets through: the 0.3 s lease runs out
        assert store.acquire_lease("t3", "w1", 5)           # w1 took it in the gap
        held.gate.set()
        time.sleep(0.3)
        assert store.lease_owner("t3") == "w1"
        with pytest.raises(LeaseLost, match="'w1' holds it now"):
            beat.check("next_step", lambda: True)
    finally:
        beat.stop()
