"""Holding a phase's watch lease in the job state, with no clock shared between machines.

The holder moves a renewal counter every WATCH_LEASE_S / 3 of its own monotonic time; any other follower
takes the watch over once it saw the (holder, counter) pair stand still for WATCH_LEASE_S of ITS own
monotonic time (gang.lease.LeaseObserver), by a compare-and-swap that names the very pair it watched. A
follower on a clock an hour off neither loses its watch nor keeps a dead one alive.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from airflow_sky.gang import state as js
from airflow_sky.gang.lease import LeaseObserver


class WatchHold:
    """One process's side of the watch on phase `key` of job `job_id`."""

    def __init__(
        self,
        states: js.JobStates,
        job_id: int,
        key: str,
        owner: str,
        lease_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.states = states
        self.job_id = job_id
        self.key = key
        self.owner = owner
        self.lease_s = js.WATCH_LEASE_S if lease_s is None else lease_s
        self._clock = clock
        self._observer = LeaseObserver(self.lease_s, clock)
        self._renewed_at: float | None = None

    def hold(self, state: js.JobState) -> tuple[js.JobState, bool]:
        """Renew the watch when due, or take it when free or lapsed; returns (the state now, held)."""
        current = state.watchers.get(self.key)
        mine = current is not None and current[0] == self.owner
        if mine and self._renewed_at is not None and self._clock() - self._renewed_at < self.lease_s / 3:
            return state, True  # renewed recently enough: no write
        stale = None
        if current is not None and not mine:
            if not self._observer.lapsed(current):
                return state, False  # another holder, alive as far as this process saw
            stale = current
        state, _ = self.states.update(self.job_id, lambda s: js.take_watch(s, self.key, self.owner, stale))
        held = state.watcher(self.key) == self.owner
        if held:
            self._renewed_at = self._clock()
        return state, held
