"""Watching every rank of one phase generation: the only code that reads all ranks' exits.

One process per phase holds the watch (a lease in the job state, taken over by any follower when it
lapses). Each `round()` probes the ranks that have not exited yet, in parallel over this process's shared
connections, writes what it learned into the job state and acts on it once: the first fault becomes the
phase's verdict (or a relaunch claim, when the recovery policy says so), a failed phase has its remaining
ranks killed, and every rank at exit 0 is the phase's success. So a job does O(n) SSH work per round and
every follower reads one record, whatever n is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from airflow_sky.errors import RemoteError
from airflow_sky.gang import state as js
from airflow_sky.gang.credential_refresh import CredentialRefresh
from airflow_sky.gang.job import KILLED_EXIT_CODE, Phase, remote_job_id
from airflow_sky.gang.notice_claims import Fault, NoticeClaims
from airflow_sky.gang.recovery import DEFAULT_MAX_RECOVERIES, Action, Decision, RecoveryState, decide
from airflow_sky.gang.watch_lease import WatchHold
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node import jobs
from airflow_sky.node.client import NodeClient
from airflow_sky.task import JobRecovery

UNREACHABLE_GRACE_S = 5.0  # an unreachable node is triaged after this long (it may be a blip)
MAX_UNREACHABLE_S = 120.0  # ... and fails the phase after this long when the infra still says it is up
LIVENESS_INTERVAL_S = 5.0  # how often a rank without an exit code is asked whether its process still runs
PROBE_THREADS = 16

# (job state, failing rank, its exit code or None when its process was lost, ranks the infra reports
# down) -> what to do about it
Triage = Callable[[js.JobState, int, int | None, list[int]], Decision]


def fail_always(state: js.JobState, rank: int, code: int | None, unhealthy: list[int]) -> Decision:
    """Setup (and a detached job): every fault fails the phase."""
    return Decision(Action.FAIL, "")


def recovery_triage(policy: JobRecovery, max_recoveries: int = DEFAULT_MAX_RECOVERIES) -> Triage:
    """The run phase: the task's job_recovery policy, counted against the job state's relaunches so far."""

    def triage(state: js.JobState, rank: int, code: int | None, unhealthy: list[int]) -> Decision:
        counts = RecoveryState(state.generation, state.recoveries, state.restarts)
        return decide(unhealthy, code, policy, counts, max_recoveries)

    return triage


@dataclasses.dataclass(frozen=True)
class Probe:
    rank: int
    exit_code: int | None = None
    lost: bool = False  # dead without an exit code
    unreachable: bool = False


def parallel(calls: Iterable[Callable[[], object]], threads: int = PROBE_THREADS) -> None:
    """Run `calls` side by side (SSH round trips: threads wait, they do not compute)."""
    todo = list(calls)
    if len(todo) <= 1:
        for call in todo:
            call()
        return
    with ThreadPoolExecutor(
        max_workers=min(threads, len(todo)), thread_name_prefix="airflow-sky-fanout"
    ) as pool:
        for future in [pool.submit(call) for call in todo]:
            future.result()


def kill_ranks(
    clients: Mapping[int, NodeClient],
    job_id: str,
    generation: int,
    sig: signal.Signals = signal.SIGKILL,
    grace_s: float = 0.5,
    record_exit_code: int = KILLED_EXIT_CODE,
) -> None:
    """Stop the job's process groups on every reachable node of `clients`, in parallel; exit code 137 is
    recorded for a rank that had none (a node we cannot reach has no process of ours left to stop)."""

    def kill(client: NodeClient) -> None:
        with contextlib.suppress(RemoteError):
            jobs.kill_job(
                client, job_id, generation, sig=sig, grace_s=grace_s, record_exit_code=record_exit_code
            )

    parallel([lambda c=c: kill(c) for c in clients.values()])  # type: ignore[misc]


class PhaseWatcher:
    """Watches phase `phase` (generation `generation`) of job `job_id` on `nodes` for whoever holds the lease."""

    def __init__(
        self,
        cluster: Cluster,
        states: js.JobStates,
        job_id: int,
        phase: Phase,
        generation: int,
        nodes: Sequence[Node],
        triage: Triage = fail_always,
        log: Callable[[str], None] = lambda message: None,
        unreachable_grace_s: float = UNREACHABLE_GRACE_S,
        max_unreachable_s: float = MAX_UNREACHABLE_S,
        liveness_interval_s: float = LIVENESS_INTERVAL_S,
    ) -> None:
        self.cluster = cluster
        self.states = states
        self.job_id = job_id
        self.phase: Phase = phase
        self.generation = generation
        self.nodes = {n.rank: n for n in nodes}
        self.triage = triage
        self.log = log
        self.unreachable_grace_s = unreachable_grace_s
        self.max_unreachable_s = max_unreachable_s
        self.liveness_interval_s = liveness_interval_s
        self.remote_job = remote_job_id(job_id, phase)
        self._clients: dict[int, NodeClient] = {}
        self._unreachable_since: dict[int, float] = {}
        self._next_liveness = 0.0
        self.claims = NoticeClaims(cluster, self.nodes, self.remote_job, self.client, log)

    @property
    def key(self) -> str:
        return js.phase_key(self.phase, self.generation)

    def client(self, rank: int) -> NodeClient:
        if rank not in self._clients:
            self._clients[rank] = self.cluster.client(self.nodes[rank], conn_retry_attempts=1)
        return self._clients[rank]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    # ---- one round ---------------------------------------------------------------------------------

    def round(self, state: js.JobState) -> js.JobState:
        """Probe, record, act; returns the job state as this round left it."""
        if state.generation != self.generation and self.phase == "run":
            return state
        phase = state.phase(self.phase, self.generation)
        if phase.verdict == "FAILED":
            return self._stop_all(state)
        if phase.verdict == "SUCCEEDED" or state.relaunch is not None:
            return state
        pending = [r for r in sorted(self.nodes) if r not in phase.exit_codes]
        probes = self._probe(pending)
        exited = {p.rank: p.exit_code for p in probes if p.exit_code is not None}
        if exited:
            state, _ = self.states.update(
                self.job_id,
                lambda s: js.record_exits(s, self.phase, self.generation, exited),
            )
        fault = self._first_fault(probes)
        if fault is None and exited and self.phase == "run":
            fault = self._exit_after_notice(exited)
        if self.phase == "run":
            fault, state = self._held_for_a_notice(fault, state)
        if fault is not None:
            state = self._on_fault(state, *fault)
            if state.phase(self.phase, self.generation).verdict == "FAILED":
                return self._stop_all(state)
            return state
        ranks = sorted(self.nodes)
        state, _ = self.states.update(
            self.job_id, lambda s: js.phase_succeeded(s, self.phase, self.generation, ranks, time.time())
        )
        return state

    def _probe(self, ranks: list[int]) -> list[Probe]:
        check_liveness = time.monotonic() >= self._next_liveness
        if check_liveness:
            self._next_liveness = time.monotonic() + self.liveness_interval_s
        results: dict[int, Probe] = {}

        def probe(rank: int) -> None:
            results[rank] = self._probe_rank(rank, check_liveness)

        parallel([lambda r=r: probe(r) for r in ranks])  # type: ignore[misc]
        return [results[r] for r in ranks]

    def _probe_rank(self, rank: int, check_liveness: bool) -> Probe:
        """The exit code file over SFTP (no process spawned on the node); liveness only now and then."""
        client = self.client(rank)
        try:
            code = jobs.read_exit_code(client, self.remote_job, self.generation)  # bounded read
            if code is not None:
                self._unreachable_since.pop(rank, None)
                return Probe(rank, exit_code=code)
            if check_liveness:
                poll = jobs.poll_job(client, self.remote_job, self.generation, 0, max_bytes=0)
                self._unreachable_since.pop(rank, None)
                if poll.exit_code is not None:
                    return Probe(rank, exit_code=poll.exit_code)
                return Probe(rank, lost=poll.lost)  # missing: not started yet (its start task runs later)
            self._unreachable_since.pop(rank, None)
            return Probe(rank)
        except RemoteError:
            client.reset()
            self._unreachable_since.setdefault(rank, time.monotonic())
            return Probe(rank, unreachable=True)

    def _first_fault(self, probes: list[Probe]) -> tuple[int, int | None, str] | None:
        """The fault to act on: a non-zero exit (one that is not a kill, first), a lost process, or a node
        that has not answered past the grace period."""
        failed = [p for p in probes if p.exit_code not in (None, 0)]
        failed.sort(key=lambda p: (p.exit_code == KILLED_EXIT_CODE, p.rank))
        if failed:
            return failed[0].rank, failed[0].exit_code, f"exit code {failed[0].exit_code}"
        for p in probes:
            if p.lost:
                return p.rank, None, "the job's processes disappeared without an exit code"
        now = time.monotonic()
        for p in probes:
            since = self._unreachable_since.get(p.rank)
            if p.unreachable and since is not None and now - since >= self.unreachable_grace_s:
                return p.rank, None, "node unreachable"
        return None

    def _held_for_a_notice(self, fault: Fault | None, state: js.JobState) -> tuple[Fault | None, js.JobState]:
        """A fault on a node that says a preemption notice came waits for the infra (gang.notice_claims);
        one the infra confirmed is recorded as a notice (times as this watcher saw them) and acted on."""
        if fault is not None and self.claims.hold(fault):
            fault = None
        settled = self.claims.settle() if fault is None else None
        if settled is None:
            return fault, state
        if settled.confirmed:
            rank, now = settled.fault[0], time.time()
            state, _ = self.states.update(
                self.job_id, lambda s: js.noted_notices(s, self.generation, {rank: now}, settled.since)
            )
        return settled.fault, state

    def _exit_after_notice(self, exited: Mapping[int, int]) -> tuple[int, int | None, str] | None:
        """A rank that ended, whatever its code, on a node the infra says is being preempted: the job was
        cut short (a trainer that checkpoints on SIGTERM may exit 0), not done."""
        noticed = self.cluster.notices([self.nodes[r] for r in sorted(exited)])
        if not noticed:
            return None
        rank = min(noticed)
        return rank, exited[rank], f"exit code {exited[rank]} after a preemption notice"

    def _on_fault(self, state: js.JobState, rank: int, code: int | None, reason: str) -> js.JobState:
        nodes = list(self.nodes.values())
        unhealthy = self.cluster.unhealthy_ranks(nodes)
        notices = self.cluster.notices(nodes) if self.phase == "run" and unhealthy else {}
        if notices:  # the infra's word, with the deadline: goodput and the progress view count from it
            state, _ = self.states.update(
                self.job_id, lambda s: js.noted_notices(s, self.generation, notices, time.time())
            )
        if code is None and reason == "node unreachable" and rank not in unhealthy:
            since = self._unreachable_since.get(rank, time.monotonic())
            if time.monotonic() - since < self.max_unreachable_s:
                return state  # the infra says it is up: a network blip until max_unreachable_s
        decision = self.triage(state, rank, code, unhealthy)
        now = time.time()
        if decision.action is Action.FAIL:
            recorded = KILLED_EXIT_CODE if code is None else code
            why = reason if not decision.reason or code is not None else f"{reason} ({decision.reason})"
            self.log(f"rank {rank}: {why}: failing the {self.phase} on every rank")
            state, changed = self.states.update(
                self.job_id,
                lambda s: js.phase_failed(s, self.phase, self.generation, rank, recorded, why, now),
            )
            if changed and self.phase == "setup":  # the cluster's event (a failed run is the job's own)
                self.cluster.record_event("setup failed", f"job {self.job_id}, rank {rank}: {why}", rank)
            return state
        if notices and decision.action is Action.RECOVER:
            ranks = ", ".join(str(r) for r in sorted(notices))
            decision = dataclasses.replace(decision, reason=f"preemption notice for rank {ranks}")
        self.log(f"rank {rank}: {reason}: {decision.action.value} ({decision.reason})")
        state, _ = self.states.update(
            self.job_id, lambda s: js.claim_relaunch(s, self.generation, decision, now)
        )
        return state

    def _stop_all(self, state: js.JobState) -> js.JobState:
        phase = state.phase(self.phase, self.generation)
        if phase.killed:
            return state
        running = {r: self.client(r) for r in sorted(self.nodes) if r not in phase.exit_codes}
        cancelled = phase.failed_rank == js.CANCELLED_RANK
        # A cancel lets the job's processes clean up (SIGTERM first); fail-fast does not wait.
        kill_ranks(
            running,
            self.remote_job,
            self.generation,
            sig=signal.SIGTERM if cancelled else signal.SIGKILL,
            grace_s=5.0 if cancelled else 0.5,
            record_exit_code=128 + signal.SIGTERM if cancelled else KILLED_EXIT_CODE,
        )
        state, _ = self.states.update(self.job_id, lambda s: js.phase_killed(s, self.phase, self.generation))
        return state


class PhaseWatch:
    """A phase's watcher behind its lease in the job state (gang.watch_lease): a round takes or renews the
    lease and probes the ranks only while this process holds it. The follow tasks, their triggers, the
    detached driver and `airflow-sky queue` all watch a phase through this. The holder also keeps the
    nodes' bucket credentials fresh (gang.credential_refresh)."""

    def __init__(self, watcher: PhaseWatcher, owner: str) -> None:
        self.watcher = watcher
        self.owner = owner
        self.hold = WatchHold(watcher.states, watcher.job_id, watcher.key, owner)
        self.credentials = CredentialRefresh(
            watcher.states,
            watcher.job_id,
            lambda: {rank: watcher.client(rank) for rank in sorted(watcher.nodes)},
            watcher.log,
            parallel,
        )

    @property
    def key(self) -> str:
        return self.watcher.key

    def round(self, state: js.JobState) -> tuple[js.JobState, bool]:
        """Hold the lease (when due, or take it when free or lapsed), then a watcher round if held."""
        state, held = self.hold.hold(state)
        if held:
            state = self.watcher.round(state)
            state = self.credentials.round(state)
        return state, held

    def round_once(self, state: js.JobState) -> js.JobState:
        """One round by a one-shot reader (`airflow-sky queue`): it has no time to watch a lease stand still,
        so it takes only a free lease, or one whose record the store has not seen written for WATCH_LEASE_S
        (a holder renews every few seconds), and gives it back at once."""
        states, key = self.watcher.states, self.key
        stale = self._lapsed_by_store_clock(state.job_id)
        if state.watcher(key) is not None and stale is None:
            return state
        state, _ = states.update(state.job_id, lambda s: js.take_watch(s, key, self.owner, stale))
        if state.watcher(key) != self.owner:
            return state
        state = self.watcher.round(state)
        state, _ = states.update(state.job_id, lambda s: js.drop_watch(s, key, self.owner))
        return state

    def _lapsed_by_store_clock(self, job_id: int) -> tuple[str, int] | None:
        states = self.watcher.states
        record = states.store.get(states.key(job_id))
        if record is None or record.written_at is None:
            return None
        current = js.JobState.from_dict(record.data).watchers.get(self.key)
        if current is None or states.store.now() - record.written_at < js.WATCH_LEASE_S:
            return None
        return current

    def release(self) -> None:
        """Give the lease up at once (this process is done): another need not wait for it to lapse."""
        with contextlib.suppress(Exception):  # the lease lapses on its own
            self.watcher.states.update(self.watcher.job_id, lambda s: js.drop_watch(s, self.key, self.owner))

    def close(self) -> None:
        self.watcher.close()
