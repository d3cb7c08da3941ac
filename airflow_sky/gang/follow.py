"""Following one rank of a phase while watching its siblings: gang semantics, fail-fast, recovery triggers.

Each rank's follow task streams its own node's log and, every few seconds, checks the other ranks of the
phase. A fault (a non-zero exit, a lost process, an unreachable node) is first triaged (see
airflow_sky.gang.recovery): when the job is to be relaunched, the follower raises Relaunch and the operator
takes it from there. Otherwise the first failure is recorded once on the head node; whoever sees it kills
the remaining ranks (recorded as exit code 137), and every follower fails naming that rank and code.
A rank that exits 0 ends its follow only when every rank has: until then a sibling's fault still concerns
it (a recovery relaunches every rank).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping

from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang.job import KILLED_EXIT_CODE
from airflow_sky.gang.recovery import Action, Decision
from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail

CANCELLED_RANK = -1  # the "failing rank" `airflow-sky cancel` records, so followers report a cancellation
UNREACHABLE_GRACE_S = 5.0  # an unreachable node is triaged after this long (it may be a blip)
MAX_UNREACHABLE_S = 120.0  # ... and the follower gives up after this long if the infra says it is up

# (rank, exit code or None for a lost process) -> the recovery decision, or None: a newer generation exists.
Triage = Callable[[int, int | None], Decision | None]


class Relaunch(Exception):
    """The job is (to be) relaunched as a new generation; `decision` is None when that already happened."""

    def __init__(self, decision: Decision | None, rank: int, exit_code: int | None) -> None:
        super().__init__(decision.reason if decision else "a newer generation of the job exists")
        self.decision = decision
        self.rank = rank
        self.exit_code = exit_code


@dataclasses.dataclass(frozen=True)
class FollowResult:
    rank: int
    exit_code: int | None  # None: still running (a follower that returns when quiet, see `until_quiet`)
    tail: tuple[str, ...]
    offset: int = 0  # the end of the last whole line read: where a later follower goes on

    @property
    def running(self) -> bool:
        return self.exit_code is None


@dataclasses.dataclass
class GangFollower:
    """Follows `rank` of the phase job `job_id` (one generation) on `clients` (rank -> connection)."""

    job_id: str
    generation: int
    rank: int
    clients: Mapping[int, NodeClient]
    emit: Callable[[str], None]  # receives each log line, already prefixed with the node's identity
    setup: bool = False
    failed_status: str = "FAILED"
    poll_interval_s: float = 0.5
    sibling_interval_s: float = 2.0
    on_failure: Callable[[int, int], None] | None = None  # (rank, code) of the recorded cause; idempotent
    triage: Triage | None = None  # None: every fault fails the phase (setup)
    start_offset: int = 0  # go on from here in the rank's log (a line boundary)
    # Return (exit_code None) once the rank runs with its log read and its siblings checked, instead of
    # waiting for the end: a deferrable task then waits in the triggerer.
    until_quiet: bool = False
    unreachable_grace_s: float = UNREACHABLE_GRACE_S
    max_unreachable_s: float = MAX_UNREACHABLE_S
    redact: Callable[[str], str] = str  # applied to the log tail a failure carries (str: unchanged)
    _sibling_unreachable_since: dict[int, float] = dataclasses.field(default_factory=dict, init=False)

    @property
    def head(self) -> NodeClient:
        return self.clients[min(self.clients)]

    def run(self) -> FollowResult:
        own = self.clients[self.rank]
        log = LogTail(own, self.job_id, self.generation, self.setup, self.emit, offset=self.start_offset)
        next_sibling_check = time.monotonic() + self.sibling_interval_s
        unreachable_since: float | None = None
        while True:
            try:
                poll = log.poll()
                unreachable_since = None
            except RemoteError:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > self.unreachable_grace_s:
                    self._triage(
                        self.rank,
                        None,
                        fail_anyway=now - unreachable_since > self.max_unreachable_s,
                        unreachable=True,
                    )
                own.close()
                time.sleep(min(5.0, self.poll_interval_s * 4))
                continue
            if poll.missing:
                self._triage(self.rank, None, fail_anyway=False)
                raise JobFailed(
                    f"rank {self.rank}: job {self.job_id} (generation {self.generation}) does not exist on its node",
                    status=self.failed_status,
                    rank=self.rank,
                )
            if log.ended:
                if poll.lost:
                    self._triage(self.rank, None, fail_anyway=False)
                    raise JobFailed(
                        f"rank {self.rank}: the job's processes disappeared without an exit code (node restarted?)",
                        status=self.failed_status,
                        rank=self.rank,
                    )
                code = int(poll.exit_code or 0)
                if code != 0:
                    self._fail(self.rank, code, log.tail)
                return self._wait_for_siblings(log.tail, log.line_offset)
            if self.until_quiet and poll.caught_up:
                self._check_siblings()
                return FollowResult(self.rank, None, log.tail, log.line_offset)
            if time.monotonic() >= next_sibling_check:
                self._check_siblings()
                next_sibling_check = time.monotonic() + self.sibling_interval_s
            if poll.caught_up:
                time.sleep(self.poll_interval_s)

    def _triage(self, rank: int, code: int | None, fail_anyway: bool, unreachable: bool = False) -> None:
        """Raise Relaunch when the fault leads to a relaunch; return when it is a plain failure.

        An unreachable node the infra still reports up is a network blip until `max_unreachable_s`: only
        then (`fail_anyway`) does it fail the phase.
        """
        if self.triage is None:
            if fail_anyway:
                raise JobFailed(f"rank {rank}: node unreachable", status=self.failed_status, rank=rank)
            return
        decision = self.triage(rank, code)
        if decision is None or decision.action is not Action.FAIL:
            raise Relaunch(decision, rank, code)
        if fail_anyway:
            raise JobFailed(f"rank {rank}: node unreachable", status=self.failed_status, rank=rank)
        if code is None and not unreachable:
            raise JobFailed(f"rank {rank}: {decision.reason}", status=self.failed_status, rank=rank)

    def _wait_for_siblings(self, tail: tuple[str, ...], offset: int) -> FollowResult:
        """This rank succeeded; the phase succeeds when every rank has. Until then a sibling's fault (a
        lost node above all) still concerns this rank: a recovery relaunches every rank, this one too."""
        next_check = 0.0
        while True:
            if time.monotonic() >= next_check:
                if self._check_siblings(own_done=True):
                    return FollowResult(self.rank, 0, tail, offset)
                if self.until_quiet:
                    return FollowResult(self.rank, None, tail, offset)  # the trigger waits for the others
                next_check = time.monotonic() + self.sibling_interval_s
            time.sleep(self.poll_interval_s)

    def _check_siblings(self, own_done: bool = False) -> bool:
        """Act on a failed or lost sibling (raise); return whether every sibling has exited 0."""
        all_done = True
        for rank, client in self.clients.items():
            if rank == self.rank:
                continue
            try:
                state = jobs.poll_job(client, self.job_id, self.generation, 0, max_bytes=0)
                self._sibling_unreachable_since.pop(rank, None)
            except RemoteError:
                all_done = False
                if self.triage is not None:
                    decision = self.triage(rank, None)
                    if decision is None or decision.action is not Action.FAIL:
                        raise Relaunch(decision, rank, None) from None
                since = self._sibling_unreachable_since.setdefault(rank, time.monotonic())
                if time.monotonic() - since > self.max_unreachable_s:
                    raise JobFailed(
                        f"rank {rank}: node unreachable", status=self.failed_status, rank=rank
                    ) from None
                continue  # a blip, or the sibling's own follower will report it
            all_done = all_done and state.exit_code == 0
            if state.lost and self.triage is not None:
                decision = self.triage(rank, None)
                if decision is None or decision.action is not Action.FAIL:
                    raise Relaunch(decision, rank, None)
            if own_done and (state.lost or state.missing):
                # While this rank runs, the sibling's own follower reports it; a finished rank must not wait.
                raise JobFailed(
                    f"rank {rank}: the job's processes disappeared without an exit code",
                    status=self.failed_status,
                    rank=rank,
                )
            if state.exit_code not in (None, 0):
                self._fail(rank, int(state.exit_code), ())
        return all_done

    def _fail(self, rank: int, code: int, tail: tuple[str, ...]) -> None:
        # A cancelled job's ranks exit non-zero too; that must never count as a fault to restart on.
        if self.triage is not None and not self._cancelled():
            self._triage(rank, code, fail_anyway=False)
        cause_rank, cause_code = jobs.record_failure(self.head, self.job_id, self.generation, rank, code)
        self._kill_others(exclude=cause_rank)
        if cause_rank == CANCELLED_RANK:
            raise JobFailed(
                "cancelled (airflow-sky cancel)", status="CANCELLED", rank=self.rank, exit_code=cause_code
            )
        if self.on_failure is not None:
            self.on_failure(cause_rank, cause_code)
        if cause_rank == self.rank:
            message = f"rank {cause_rank} failed with exit code {cause_code}; killed the processes on the other nodes"
            if tail:
                message += "\nlast log lines:\n" + "\n".join(self.redact(line) for line in tail)
            raise JobFailed(message, status=self.failed_status, rank=cause_rank, exit_code=cause_code)
        raise JobFailed(
            f"killed: rank {cause_rank} failed with exit code {cause_code}",
            status=self.failed_status,
            rank=cause_rank,
            exit_code=KILLED_EXIT_CODE,
        )

    def _cancelled(self) -> bool:
        try:
            recorded = jobs.recorded_failure(self.head, self.job_id, self.generation)
        except (RemoteError, OSError):
            return False
        return recorded is not None and recorded[0] == CANCELLED_RANK

    def _kill_others(self, exclude: int) -> None:
        kill_ranks(self.clients, self.job_id, self.generation, exclude=exclude)


def kill_ranks(
    clients: Mapping[int, NodeClient], job_id: str, generation: int, exclude: int | None = None
) -> None:
    """SIGKILL the job's process groups on every reachable node but `exclude`, recording exit code 137."""
    for rank, client in clients.items():
        if rank == exclude:
            continue
        # A node we cannot reach has no process of ours left to stop.
        with contextlib.suppress(RemoteError):
            jobs.kill_job(
                client, job_id, generation, sig=signal.SIGKILL, grace_s=0.5, record_exit_code=KILLED_EXIT_CODE
            )
