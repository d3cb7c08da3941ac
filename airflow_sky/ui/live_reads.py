"""Live reads of jobs' progress on a few threads of the plugin's own, so that slow clusters never hold the API
server's threads: the server runs each request on a thread of a small shared pool (anyio's, 40 by default).

At most `slots` reads run at once, one per job: a job whose read is still running is not read again. A
request waits for the reads it needs at most `timeout_s` in all (not per job), and not at all for a read
an earlier request already gave up on (a hung cluster); when every slot stays taken past a short wait the
job is answered without a live read. The caller then shows the job's final progress.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

log = logging.getLogger(__name__)

LIVE_SLOTS = 4  # live reads at once, across every request of this API server
SLOT_WAIT_S = 0.2  # how long a request waits for a free slot before it answers without a live read

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclasses.dataclass
class _Flight:
    future: concurrent.futures.Future[Any]
    abandoned: bool = False  # a request stopped waiting for it: later ones do not wait either


class LiveReads:
    """Bounded, deduplicated reads by key; see the module's docstring."""

    def __init__(self, slots: int = LIVE_SLOTS, slot_wait_s: float = SLOT_WAIT_S) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="sky-progress"
        )
        self._slots = threading.BoundedSemaphore(slots)
        self._slot_wait_s = slot_wait_s
        self._flights: dict[Hashable, _Flight] = {}  # reads running now
        self._guard = threading.Lock()

    def running(self) -> int:
        with self._guard:
            return len(self._flights)

    def read_all(self, reads: Mapping[K, Callable[[], T]], timeout_s: float) -> dict[K, T | None]:
        """Each key's result, or None for a key not read in time (busy, hung, or its read raised)."""
        deadline = time.monotonic() + timeout_s
        flights = {key: self._start(key, read) for key, read in reads.items()}
        waited = [f.future for f in flights.values() if f is not None and not f.abandoned]
        concurrent.futures.wait(waited, timeout=max(0.0, deadline - time.monotonic()))
        results: dict[K, T | None] = {}
        for key, flight in flights.items():
            results[key] = None
            if flight is None:
                log.info(
                    "progress read %s: %d live reads running already; answered without one",
                    key,
                    self.running(),
                )
            elif flight.future.done():
                results[key] = None if flight.future.exception() else flight.future.result()
            else:
                if not flight.abandoned:
                    log.warning("progress read %s: no answer in %.0f s", key, timeout_s)
                flight.abandoned = True
        return results

    def _start(self, key: Hashable, read: Callable[[], Any]) -> _Flight | None:
        with self._guard:
            running = self._flights.get(key)
        if running is not None:
            return running
        if not self._slots.acquire(timeout=self._slot_wait_s):
            return None
        with self._guard:
            running = self._flights.get(key)
            if running is not None:  # another request started it meanwhile
                self._slots.release()
                return running
            # A free slot means a free worker: the read starts now, never queued behind hung ones.
            flight = self._flights[key] = _Flight(self._pool.submit(read))
        flight.future.add_done_callback(lambda _: self._finish(key))
        return flight

    def _finish(self, key: Hashable) -> None:
        with self._guard:
            self._flights.pop(key, None)
        self._slots.release()
