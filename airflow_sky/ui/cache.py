"""A run's answer kept about a second, so that many open views of one run cost one read of its jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

CACHE_TTL_S = 1.0
CACHE_ENTRIES = 256  # views of this many runs at once; older answers are dropped first


class TtlCache:
    """Answers by key for `ttl_s`; concurrent callers of one key wait for a single computation."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, entries: int = CACHE_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self._answers: dict[Hashable, tuple[float, Any]] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # a second view of the same run waits for the first read instead of reading again
            hit = self._answers.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                return hit[1]
            answer = compute()
            with self._guard:
                self._answers[key] = (time.monotonic(), answer)
                self._evict()
            return answer

    def _evict(self) -> None:
        now = time.monotonic()
        for key in [k for k, (at, _) in self._answers.items() if now - at >= self.ttl_s]:
            del self._answers[key]
            self._locks.pop(key, None)
        while len(self._answers) > self.entries:
            oldest = min(self._answers, key=lambda k: self._answers[k][0])
            del self._answers[oldest]
            self._locks.pop(oldest, None)
