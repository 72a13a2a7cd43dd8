"""Who runs an instance right now: the store's lease, held while a block runs it.

Everything that runs or changes a stored instance takes its lease first and loads it after:
a worker (``engine.worker``), ``layerflow resume`` and the other CLI commands that run one
(``engine.cli``), and the REST API (``engine.governance``). So two of them never run one
instance at once. The version check alone would keep every update, but only by refusing the
later save: the activities the loser ran (a handler's side effect, a model call) would have
run for nothing, and run again by whoever retries.

``holding`` yields None while the block holds the lease (renewed by a ``Heartbeat`` every
third of its ttl), or the name of who holds it when someone else does; then nothing is held
and the caller refuses (a worker gives its entry back, the CLI exits, the API answers 409).
A store without leases (a records-only ``engine.store.Store``) holds nothing and yields None.

A holder that was paused past its lease (a stopped process, a long GC pause, a suspended VM)
may find, when it goes on, that someone else holds the instance now. Its next save may still
go through (the taker has not saved yet), so the version check alone would not keep it from
starting the next activity, whose side effects the taker runs too. ``Heartbeat.check``, called
before each activity (``Instance.lease_check``), renews the lease or raises ``LeaseLost``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from context_layers.stores import Store, StoreError, VersionConflict

__all__ = ["LEASE_TTL", "Heartbeat", "LeaseLost", "holding", "lease_store"]

LEASE_TTL = 60.0  # seconds; renewed every third of it while the block runs


class LeaseLost(VersionConflict):
    """The holder's lease on an instance lapsed (someone else holds it, or nobody does any more)
    before the activity it was about to start: it stops working the instance, saving nothing
    more; whoever holds the lease goes on from the last save. A ``VersionConflict`` (its kind):
    the same outcome as a save that another writer won, one step earlier."""

    def __init__(self, message: str, *, instance_id: str, task_id: str, holder: str | None) -> None:
        super().__init__(message)
        self.instance_id, self.task_id, self.holder = instance_id, task_id, holder


class Heartbeat:
    """Renews the lease every ttl/3 until ``stop`` (taking it back when it ran out and nobody took
    it); ``lost`` once someone else took it (the version check then refuses the holder's save).
    ``check`` renews it at once, before an activity, and raises ``LeaseLost`` when it no longer holds."""

    def __init__(self, store: Store, instance_id: str, owner: str, ttl: float) -> None:
        self._stop = threading.Event()
        self.lost = False
        # the lease ran out and this heartbeat took it back (nobody else had): ``check`` makes sure
        # nobody saved the instance in the gap before the next activity starts
        self.lapsed = False
        self._store, self._instance_id, self._owner, self._ttl = store, instance_id, owner, ttl

        def beat() -> None:
            while not self._stop.wait(ttl / 3):
                try:
                    if store.renew_lease(instance_id, owner, ttl):
                        continue
                    # Run out under a holder that is still at work: a stall of the whole process longer
                    # than the lease (an import that holds the interpreter, a swapped-out VM). Left free,
                    # `list` showed the instance held by nobody, and a worker taking the entry over ran
                    # the activity in hand a second time beside this one; take it back while nobody has.
                    if not self.lost and store.acquire_lease(instance_id, owner, ttl):
                        self.lapsed = True
                        continue
                    self.lost = True  # and go on beating: ``check`` may take a lapsed lease again
                except StoreError:
                    pass

        self._thread = threading.Thread(target=beat, name=f"lease-{instance_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self, task_id: str, unchanged: Callable[[], bool] | None = None) -> None:
        """Before activity ``task_id``: renew the lease, or raise ``LeaseLost`` (a store that does
        not answer raises its ``StoreUnavailable``: an outage, not a loss). A lease that ran out
        with nobody taking it (a pause longer than its ttl, nothing more) is taken again when
        ``unchanged()`` says nobody saved the instance meanwhile."""
        if not self.lost and self._store.renew_lease(self._instance_id, self._owner, self._ttl):
            if not self.lapsed:
                return
            if unchanged is not None and unchanged():
                self.lapsed = False
                return
            self._store.release_lease(self._instance_id, self._owner)  # someone may have saved it in the gap
            self.lost = True
            raise LeaseLost(f"instance {self._instance_id}: the lease of {self._owner!r} lapsed and someone may "
                            f"have saved the instance before {self._owner!r} took it back; it stops working it without "
                            f"starting activity {task_id!r}, and whoever holds the lease goes on from the last save",
                            instance_id=self._instance_id, task_id=task_id, holder=None)
        holder = self._store.lease_owner(self._instance_id)
        if holder is None and unchanged is not None and self._store.acquire_lease(
                self._instance_id, self._owner, self._ttl):
            if unchanged():
                self.lost = False
                return
            self._store.release_lease(self._instance_id, self._owner)
        self.lost = True
        who = f"{holder!r} holds it now" if holder else "it ran out, and someone else took it or saved the instance since"
        raise LeaseLost(f"instance {self._instance_id}: the lease of {self._owner!r} lapsed ({who}) before "
                        f"activity {task_id!r}; {self._owner!r} stops working it without starting that activity, "
                        "and whoever holds the lease goes on from the last save",
                        instance_id=self._instance_id, task_id=task_id, holder=holder)


def lease_store(engine_store: Any) -> Store | None:
    """The lease-keeping store behind an engine's store (``InstanceRecords`` wraps one), or None."""
    store = getattr(engine_store, "store", engine_store)
    return store if isinstance(store, Store) else None


def held_by(engine_store: Any, instance_id: str, status: str) -> str | None:
    """Who runs the instance right now (holds its lease), or None. Not only a ``running`` one: a worker
    that fires a waiting instance's due timer, or a resume with answers, holds it while the store still
    says ``waiting`` (or ``error``, a failed activity retried) until its first save."""
    leases = lease_store(engine_store)
    if leases is None or status in ("completed", "cancelled"):
        return None
    return leases.lease_owner(instance_id)


@contextlib.contextmanager
def holding(engine_store: Any, instance_id: str, owner: str, *, ttl: float = LEASE_TTL,
            wait: float = 0.0) -> Iterator[str | None]:
    """Hold ``instance_id``'s lease as ``owner`` while the block runs; yields None, or who holds
    it when someone else still does after ``wait`` seconds (then nothing is held)."""
    store = lease_store(engine_store)
    if store is None:
        yield None
        return
    give_up = time.monotonic() + wait
    while not store.acquire_lease(instance_id, owner, ttl):
        if time.monotonic() >= give_up:
            yield store.lease_owner(instance_id) or "another process"
            return
        time.sleep(0.05)
    heartbeat = Heartbeat(store, instance_id, owner, ttl)
    try:
        yield None
    finally:
        heartbeat.stop()
        with contextlib.suppress(StoreError):
            store.release_lease(instance_id, owner)
