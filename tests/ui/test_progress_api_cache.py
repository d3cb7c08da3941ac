"""The progress API's answer cache (pure): many views of one run cost one read, a second later they read
again, and it holds a bounded number of runs."""

from __future__ import annotations

import threading
import time

from airflow_sky.ui.cache import TtlCache


def test_views_of_one_run_arriving_together_cost_one_read() -> None:
    cache = TtlCache(ttl_s=3600)
    reads: list[int] = []
    release = threading.Event()
    ready = threading.Barrier(9)
    answers: list[object] = []

    def read() -> dict[str, int]:
        reads.append(1)
        assert release.wait(120), "the test never released the read"
        return {"step": 7}

    def view() -> None:
        ready.wait(120)
        answers.append(cache.get(("dag", "run", True), read))

    threads = [threading.Thread(target=view) for _ in range(8)]
    for thread in threads:
        thread.start()
    ready.wait(120)
    # Give the other views time to read too, were they not held: without the lock all 8 read within this
    # time; with it the wait runs out (a slow machine only makes late views find the cached answer).
    deadline = time.monotonic() + 2.0
    while len(reads) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(120)
    assert len(reads) == 1
    assert answers == [{"step": 7}] * 8


def test_an_answer_older_than_its_time_is_read_again_and_other_runs_are_read_apart() -> None:
    expired = TtlCache(ttl_s=0)
    counter = iter(range(100))
    assert [expired.get("run", lambda: next(counter)) for _ in range(3)] == [0, 1, 2]
    held = TtlCache(ttl_s=3600)
    assert held.get("a", lambda: "A") == "A"
    assert held.get("b", lambda: "B") == "B"
    assert held.get("a", lambda: "again") == "A"


def test_the_cache_keeps_at_most_its_entries() -> None:
    cache = TtlCache(ttl_s=3600, entries=3)
    for run in range(10):
        cache.get(run, lambda run=run: run)
    assert len(cache._answers) == 3
    assert cache.get(9, lambda: "read again") == 9
    assert cache.get(0, lambda: "read again") == "read again"
