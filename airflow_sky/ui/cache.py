"""A run's answer kept about a second, so that many open views of one run cost one read of its jobs.

Bounded whatever the callers ask: at most `entries` answers (the oldest dropped first), and a key holds a
lock only while its read runs and callers wait for it. A request for a run that does not exist (any URL
a user types) leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

CACHE_TTL_S = 1.0
CACHE_ENTRIES = 256  # views of this many runs at once; older answers are dropped first


@dataclasses.dataclass
class _Read:
    """One key's read in progress: its lock, and how many callers hold or wait for it."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    users: int = 0


class TtlCache:
    """Answers by key for `ttl_s`; concurrent callers of one key wait for a single computation."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, entries: int = CACHE_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self._answers: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()  # oldest first
        self._reads: dict[Hashable, _Read] = {}  # only keys being read now
        self._guard = threading.Lock()

    def __len__(self) -> int:
        """Answers and reads held now (what the cache's memory grows with)."""
        with self._guard:
            return len(self._answers) + len(self._reads)

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._guard:
            hit = self._fresh(key)
            if hit is not None:
                return hit[1]
            read = self._reads.setdefault(key, _Read())
            read.users += 1
        try:
            with read.lock:  # a second view of the same run waits for the first read instead of reading again
                with self._guard:
                    hit = self._fresh(key)
                if hit is not None:
                    return hit[1]
                answer = compute()  # raising (an unknown run) stores nothing
                with self._guard:
                    self._answers[key] = (time.monotonic(), answer)
                    self._answers.move_to_end(key)
                    self._evict()
                return answer
        finally:
            with self._guard:
                read.users -= 1
                if read.users == 0:
                    del self._reads[key]

    def clear(self) -> None:
        """Forget every answer (an action changed what the next read shows)."""
        with self._guard:
            self._answers.clear()

    def _fresh(self, key: Hashable) -> tuple[float, Any] | None:
        hit = self._answers.get(key)
        return hit if hit is not None and time.monotonic() - hit[0] < self.ttl_s else None

    def _evict(self) -> None:
        now = time.monotonic()
        while self._answers:
            oldest, (at, _) = next(iter(self._answers.items()))
            if len(self._answers) <= self.entries and now - at < self.ttl_s:
                return
            del self._answers[oldest]
