"""The progress API's answer cache and live reads (pure): many views of one run cost one read, a second later
they read again, it holds a bounded number of runs and no lock for a run that does not exist, and slow
live reads hold only their own few threads."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable, Hashable
from typing import Any

from airflow_sky.ui.cache import TtlCache
from airflow_sky.ui.live_reads import LiveReads


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


class NoSuchRun(LookupError):
    """Stands for run_jobs.RunNotFound (which needs Airflow's models): what a read of an unknown run raises."""


def _unknown(run_id: str) -> object:
    raise NoSuchRun(run_id)


def test_ten_thousand_unknown_run_ids_keep_the_cache_flat() -> None:
    cache = TtlCache(ttl_s=3600)

    refused = [0]  # a count (a list of 10,000 items would be the growth measured)

    def ask(first: int, count: int) -> None:
        for i in range(first, first + count):
            try:  # not pytest.raises: it keeps tracebacks, which tracemalloc would count
                cache.get(("dag", f"forged-{i}", True), lambda i=i: _unknown(f"forged-{i}"))
            except NoSuchRun:
                refused[0] += 1

    ask(0, 100)  # warm up the interpreter's own caches before measuring
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ask(100, 10_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert refused == [10_100]
    assert len(cache) == 0, "an unknown run left an answer or a lock behind"
    assert grown < 64 * 1024, f"10,000 unknown runs grew the cache by {grown} bytes"


def test_many_known_runs_keep_at_most_the_caches_entries_and_no_locks() -> None:
    cache = TtlCache(ttl_s=3600, entries=50)
    for i in range(10_000):
        cache.get(("dag", f"run-{i}", True), lambda i=i: {"run": i})
    assert len(cache) == 50
    assert len(cache._reads) == 0


def _hung(started: list[str], name: str, release: threading.Event) -> Callable[[], str]:
    def read() -> str:
        started.append(name)
        assert release.wait(120), "the test never released the hung read"
        return name

    return read


def test_hung_live_reads_take_only_their_slots_and_every_other_request_is_answered_quickly() -> None:
    """Live reads of hung clusters stand in as functions waiting on an event (no emulator makes a state
    store hang on cue); what is tested is the bound on threads, which is this module's."""
    reads = LiveReads(slots=2, slot_wait_s=0.2)
    release = threading.Event()
    started: list[str] = []
    try:
        began = time.monotonic()
        first = reads.read_all(
            {"a": _hung(started, "a", release), "b": _hung(started, "b", release), "c": lambda: "c"}, 1.0
        )
        # One budget for the whole request (not 1 s per job); "c" found no free slot.
        assert first == {"a": None, "b": None, "c": None}
        assert time.monotonic() - began < 10
        # 20 more requests at once (API-server threads): a hung job is not waited for again, a new job finds
        # no free slot; each answers within the slot wait, and no read beyond the two hung ones starts.
        answers: list[dict[Hashable, Any]] = []
        took: list[float] = []

        def request(i: int) -> None:
            at = time.monotonic()
            answers.append(reads.read_all({"a": _hung(started, "a", release), i: lambda i=i: i}, 30.0))
            took.append(time.monotonic() - at)

        threads = [threading.Thread(target=request, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(answers) == 20 and all(set(a.values()) == {None} for a in answers)
        assert max(took) < 10, f"a request waited {max(took):.1f}s behind hung reads"
        assert sorted(started) == ["a", "b"]
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while reads.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reads.read_all({"c": lambda: "c", "a": lambda: "a"}, 30.0) == {"c": "c", "a": "a"}


def test_a_live_read_that_raises_answers_none_and_frees_its_slot() -> None:
    reads = LiveReads(slots=1)

    def broken() -> str:
        raise OSError("state store unreachable")

    assert reads.read_all({"x": broken}, 30.0) == {"x": None}
    deadline = time.monotonic() + 60
    while reads.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reads.read_all({"y": lambda: "y"}, 30.0) == {"y": "y"}
