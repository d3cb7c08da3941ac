"""Judging another process's lease on this process's own clock.

A lease whose expiry is a time written by its holder compares two machines' clocks: a holder whose clock
runs behind looks dead, one whose clock runs ahead looks alive forever. Here the holder only moves a
counter (or anything that changes when it renews); an observer notes when it last saw the value change, on
its own monotonic clock, and calls the lease lapsed when it has stood still for `lease_s`. A paused observer
only waits longer; a paused holder is seen as lapsed, which fencing tokens make safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class LeaseObserver:
    """Whether the lease seen as `token` stood still for `lease_s` seconds of this process's monotonic time."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._token: Hashable = object()  # matches nothing: the first look starts the wait
        self._since = 0.0

    def lapsed(self, token: Hashable) -> bool:
        now = self._clock()
        if token != self._token:
            self._token, self._since = token, now
            return False
        return now - self._since >= self.lease_s

    def quiet_for(self) -> float:
        """How long the last token seen has stood still."""
        return self._clock() - self._since
