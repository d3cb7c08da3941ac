"""Where a job's progress records live (the infra's StateStore, `progress/<job id>/<rank>`), and the
collector a rank's follower feeds with the reports it reads from that rank's log (gang.job_progress holds
the record's rules and the summary)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from airflow_sky.gang.job_progress import HISTORY_POINTS, RankProgress, summarize, with_report
from airflow_sky.gang.state_record import JobState
from airflow_sky.infra.state_store import StateStore
from airflow_sky.progress import Report

log = logging.getLogger(__name__)

WRITE_INTERVAL_S = 3.0  # a rank's record is written at most this often while its reports change


# ---- the records in the store -------------------------------------------------------------------------


class ProgressRecords:
    """The progress records of one cluster's jobs, in its infra's StateStore."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    @staticmethod
    def key(job_id: int, rank: int) -> str:
        return f"progress/{int(job_id)}/{int(rank)}"

    def read(self, job_id: int, rank: int) -> RankProgress | None:
        record = self.store.get(self.key(job_id, rank))
        return RankProgress.from_dict(record.data) if record else None

    def read_all(self, job_id: int, ranks: Iterable[int] | None = None) -> dict[int, RankProgress]:
        """Every rank's record of job `job_id` (or those of `ranks`: one read each, no listing)."""
        if ranks is None:
            keys = self.store.keys(f"progress/{int(job_id)}")
            ranks = sorted(int(k.rsplit("/", 1)[1]) for k in keys)
        found = {rank: self.read(job_id, rank) for rank in ranks}
        return {rank: p for rank, p in found.items() if p is not None}

    def write(self, job_id: int, progress: RankProgress) -> None:
        """Write rank `progress.rank`'s record (one writer per rank: the last write wins)."""
        key = self.key(job_id, progress.rank)
        for _ in range(5):
            current = self.store.get(key)
            if self.store.put(key, progress.to_dict(), current.version if current else None) is not None:
                return
        log.warning(
            "progress of job %s rank %s: the record kept changing; not written", job_id, progress.rank
        )

    def summary(self, state: JobState, now: float | None = None, with_history: bool = True) -> dict[str, Any]:
        """The progress document of `state`'s job, read now."""
        ranks = self.read_all(state.job_id, range(state.num_nodes) if state.num_nodes else None)
        return summarize(ranks, state, time.time() if now is None else now, with_history=with_history)


# ---- collecting while following -----------------------------------------------------------------------


class ProgressCollector:
    """Turns the reports read from one rank's log into that rank's record: `add` is called for each report
    (cheap, in memory), `flush` writes when something changed and WRITE_INTERVAL_S passed (or `force`).

    Collecting never fails a job: a store error is logged and the next flush tries again.
    """

    def __init__(
        self,
        records: ProgressRecords,
        job_id: int,
        rank: int,
        generation: int,
        clock: Callable[[], float] = time.time,
        interval_s: float = WRITE_INTERVAL_S,
    ) -> None:
        self.records = records
        self.job_id = job_id
        self.rank = rank
        self.generation = generation
        self.clock = clock
        self.interval_s = interval_s
        self._progress: RankProgress | None = None
        self._loaded = False
        self._pending: list[Report] = []
        self._next_write = 0.0
        self._replayed_to: int | None = None

    @property
    def latest(self) -> RankProgress | None:
        return self._progress

    def add(self, report: Report) -> None:
        self._pending.append(report)
        if len(self._pending) > 4 * HISTORY_POINTS:
            del self._pending[
                : -2 * HISTORY_POINTS
            ]  # a log read far behind: its oldest reports thinned anyway

    def flush(self, force: bool = False) -> bool:
        """Write the record when due; returns whether it wrote."""
        now = self.clock()
        if not self._pending or (not force and now < self._next_write):
            return False
        try:
            if not self._loaded:
                self._progress = self.records.read(self.job_id, self.rank)  # a relaunch goes on with it
                self._loaded = True
                self._replayed_to = _recorded_step(self._progress, self.generation)
            progress = self._progress
            for report in self._pending:
                if self._replayed_to is not None:
                    if report.step <= self._replayed_to:
                        continue  # a retried follow re-reads the log from its start: counted already
                    self._replayed_to = None
                progress = with_report(progress, self.rank, self.generation, report, now) or progress
            if progress is not None and progress != self._progress:
                self.records.write(self.job_id, progress)
            self._pending.clear()
            if progress is None or progress == self._progress:
                return False
            self._progress = progress
            self._next_write = now + self.interval_s
            return True
        except Exception as error:  # progress is never worth failing the job for
            log.warning("progress of job %s rank %s not written: %s", self.job_id, self.rank, error)
            self._next_write = now + self.interval_s
            return False


def _recorded_step(progress: RankProgress | None, generation: int) -> int | None:
    """The step the record already holds for `generation`: a follower starting over (a retried task reads
    the log from 0) skips the reports up to it, so no step is counted twice."""
    return progress.step if progress is not None and progress.generation == generation else None
