"""The engine's live view of a run: task-state events from Airflow's listener hooks, and every node's log.

`TaskEvents` is registered with the Task SDK's listener manager while the engine runs the DAG, so it sees
each task instance start, succeed or fail in this process. `NodeLogs` streams the setup and run log of every
rank straight from the nodes, as `sky launch` shows them: a sequential runner follows one rank at a time,
and the user must still see every node live (and `queue`/`progress` every rank's reports: NodeLogs records
them, and tells the job's progress as `progress` events; the report lines never reach the sink). Both hand
Events to one sink.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from airflow.listeners import hookimpl
from airflow.sdk.listener import get_listener_manager

from airflow_sky.client.events import Event, Listener
from airflow_sky.errors import JobFailed, RemoteError
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.job import KILLED_EXIT_CODE, PHASES, JobHandle, Phase
from airflow_sky.gang.job_progress import summarize
from airflow_sky.gang.progress_store import ProgressCollector, ProgressRecords
from airflow_sky.gang.state import JobState
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.client import NodeClient
from airflow_sky.node.log_tail import LogTail

_POLL_S = 0.3  # between passes while logs grow ...
_MAX_IDLE_POLL_S = 1.0  # ... backing off to this while every log is quiet
_START_CHECK_S = 1.0  # how often a rank is asked whether its phase has started there
_GENERATION_CHECK_S = 5.0  # how often a rank whose run ended is asked for a newer generation (a recovery)
_RECONNECT_S = 2.0

logger = logging.getLogger(__name__)


class TaskEvents:
    """Airflow listener: task-instance state changes of the engine's DAG run as Events."""

    def __init__(self, sink: Listener) -> None:
        self._sink = sink

    @staticmethod
    def _step_and_rank(task_instance: Any) -> tuple[str, int | None]:
        step = str(task_instance.task_id).rsplit(".", 1)[-1]
        node = getattr(task_instance.task, "node", None)
        rank = int(node["rank"]) if isinstance(node, dict) and "rank" in node else None
        return step, rank

    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        step, rank = self._step_and_rank(task_instance)
        self._sink(Event("task_started", step, rank))

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        step, rank = self._step_and_rank(task_instance)
        if step == "provision":
            handle = task_instance.xcom_pull(task_ids=task_instance.task_id, key="handle")
            nodes = task_instance.xcom_pull(task_ids=task_instance.task_id)
            if handle:
                self._sink(Event("job", step, data={**handle, "nodes": list(nodes or [])}))
        if step == "collect":  # the job's result (the head's return.json), for a pipeline's next job
            self._sink(
                Event("result", step, data={"value": task_instance.xcom_pull(task_ids=task_instance.task_id)})
            )
        self._sink(Event("task_done", step, rank))
        if step.endswith("_follow") and rank is not None:
            self._sink(Event("exit", step, rank, exit_code=0))

    @hookimpl
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
        step, rank = self._step_and_rank(task_instance)
        text = str(error) if error else "failed"
        self._sink(Event("task_failed", step, rank, text))
        if step.endswith("_follow") and rank is not None:
            code = None
            if isinstance(error, JobFailed) and (error.rank == rank or error.exit_code == KILLED_EXIT_CODE):
                code = error.exit_code
            self._sink(Event("exit", step, rank, text, exit_code=code))


@contextlib.contextmanager
def task_events(sink: Listener) -> Iterator[None]:
    """Deliver this process's task-instance events to `sink` while the block runs."""
    listener = TaskEvents(sink)
    manager = get_listener_manager()
    manager.add_listener(listener)
    try:
        yield
    finally:
        manager.pm.unregister(listener)


def drains_logs_first(event: Event, first_start: bool) -> bool:
    """Whether every node log line read so far is told before `event`: a phase's banner (the first start
    of its step) and each verdict (a failed task, a rank's non-zero exit) follow the lines that led to
    them, which the log thread may not have read yet."""
    if event.kind == "task_started":
        return first_start
    return event.kind == "task_failed" or (event.kind == "exit" and event.exit_code != 0)


def ends_the_logs(event: Event) -> bool:
    """Whether the node logs are read for the last time before `event`: the teardown's start. The logs go
    with the nodes, and a reader that still polled would hold SSH sessions open on hosts being handed back:
    an ssh pool's reset ends every session of the login user and frees the host only once none is left, so
    a reader reconnecting through it keeps the host locked."""
    return event.kind == "task_started" and event.step == "teardown"


class LogOrder:
    """Which of the task runner's events wait for the node logs to be drained (drains_logs_first)."""

    def __init__(self) -> None:
        self._started: set[str] = set()

    def drain_before(self, event: Event) -> bool:
        first_start = event.kind == "task_started" and event.step not in self._started
        if first_start:
            self._started.add(event.step)
        return drains_logs_first(event, first_start)


class _RankLog:
    """One rank's log of one phase, following the job's generations (a recovery starts a new one).

    A run log's progress reports go into the rank's record as they are read (`records`): an in-process
    launch runs its follow tasks one after another, so this reader is the only one that sees every rank live
    (a follow task that reads a log later skips the steps already recorded).
    """

    def __init__(
        self,
        job: GangJob,
        phase: Phase,
        rank: int,
        emit: Callable[[str], None],
        records: ProgressRecords | None = None,
    ) -> None:
        self.job = job
        self.phase = phase
        self.rank = rank
        self.emit = emit
        self.records = records if phase == "run" else None
        self.tail: LogTail | None = None
        self.progress: ProgressCollector | None = None
        self.next_check = 0.0
        self.new_generation = False  # set by a poll that moved on to a newer generation

    def poll(self, client: NodeClient, state: JobState | None) -> bool:
        """Read what is new; return whether more is waiting right now.

        An ended setup log is looked at again only when asked (`next_check = 0`): setup runs again only on
        a node that replaced a lost one, and only after the run moved to a new generation.
        """
        now = time.monotonic()
        self.new_generation = False
        if self.tail is None or self.tail.ended:
            if now < self.next_check:
                return False
            if self.tail is None:
                self.next_check = now + _START_CHECK_S
            else:
                self.next_check = now + _GENERATION_CHECK_S if self.phase == "run" else float("inf")
            if state is None:
                return False
            generation = state.generation if self.phase == "run" else state.setup_generation(self.rank)
            if self.tail is not None and generation <= self.tail.generation:
                return False
            try:
                started = self.job.started(client, self.phase, generation)
            except RemoteError:
                # A lost node: ask again on the next pass (its replacement's setup must be shown), not
                # only at the next check (never, for an ended setup log).
                self.next_check = 0.0
                raise
            if not started:
                return False  # not started on its node yet
            self.new_generation = self.tail is not None
            self.flush_progress()  # the older generation's last reports
            if self.records is not None:
                self.progress = ProgressCollector(self.records, self.job.job_id, self.rank, generation)
            self.tail = self.job.log_tail(
                client,
                self.phase,
                generation,
                self.emit,
                keep=0,
                on_report=self.progress.add if self.progress is not None else None,
            )
        self.tail.client = client  # a replaced node answers on a new connection
        caught_up = self.tail.poll().caught_up
        if self.progress is not None:
            self.progress.flush(force=self.tail.ended)  # when due: at most every WRITE_INTERVAL_S
        if (
            self.tail.ended
            and self.phase == "run"
            and state is not None
            and state.generation > self.tail.generation
        ):
            self.next_check = 0.0  # a relaunch: the newer generation's log is read on the next pass
            return True
        return not caught_up

    def flush_progress(self) -> None:
        """Write the reports read so far now (never raises: progress never fails the view)."""
        if self.progress is not None:
            self.progress.flush(force=True)


class NodeLogs:
    """Streams every rank's setup and run log to `sink` (redacted), from one thread, until stop().

    A phase's logs are read once `activate(phase)` says its start tasks run (the engine calls it on their
    `task_started` event), so nothing polls a node for a phase that has not begun.
    """

    def __init__(
        self,
        cluster: Cluster,
        handle: JobHandle,
        sink: Listener,
        redact: Callable[[str], str],
        phases: tuple[Phase, ...] = PHASES,
    ) -> None:
        self.cluster = cluster
        self.handle = handle
        self._sink = sink
        self._redact = redact
        self._job = GangJob.of(cluster, handle)
        records = ProgressRecords(self._job.states.store)
        self._logs = [
            _RankLog(self._job, phase, node.rank, self._emitter(phase, node.rank), records)
            for phase in phases
            for node in handle.phase_nodes(phase)
        ]
        self._active: set[Phase] = set()
        self._announced = handle.generation  # the newest relaunch claim told to the sink
        self._nodes = {n.rank: n for n in handle.nodes}
        self._clients: dict[int, NodeClient] = {}
        self._down_until: dict[int, float] = {}
        self._told: tuple[tuple[int, int], ...] = ()  # the records the last `progress` event was made of
        self._stop = threading.Event()
        self._polling = threading.Lock()  # one reader of the logs at a time: the thread, or a drain
        self._thread = threading.Thread(target=self._run, name="airflow-sky-node-logs", daemon=True)

    def _emitter(self, phase: Phase, rank: int) -> Callable[[str], None]:
        step = f"{phase}_follow"
        return lambda line: self._sink(Event("log", step, rank, self._redact(line)))

    def start(self) -> None:
        self._thread.start()

    def activate(self, phase: Phase) -> None:
        """Begin reading `phase`'s logs (its scripts are being started)."""
        self._active.add(phase)

    def drain(self, reconnect: bool = True) -> None:
        """Read every active log to its current end now, from the caller's thread.

        The engine calls it before a phase's banner and a verdict are told (see LogOrder), so that they
        follow the lines that led to them, and before the teardown task runs: once the nodes are gone, so
        are their logs. `reconnect`: also try nodes that stopped answering a moment ago (a lost cloud node
        may take a connect timeout to say so: not for every verdict of a recovery). A read that fails
        leaves the lines to the next pass: the view never fails the run.
        """
        if threading.current_thread() is self._thread or self._stop.is_set():
            return  # an event this thread itself told (it reads the logs anyway), or the logs are over
        try:
            for _ in range(100):
                if not self._pass(final=True, reconnect=reconnect):
                    break
        except Exception:
            logger.debug("reading the node logs before an event failed", exc_info=True)

    def stop(self) -> None:
        """Stop after one last pass that reads every log to its current end, then close the connections
        (from the caller's thread; again: nothing)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    def _run(self) -> None:
        idle = _POLL_S
        while not self._stop.is_set():
            if self._pass():
                idle = _POLL_S
                continue
            self._stop.wait(idle)
            idle = min(idle * 1.5, _MAX_IDLE_POLL_S)
        for _ in range(100):  # whatever the last poll left behind
            if not self._pass(final=True):
                break
        for log in self._logs:
            if log.tail is not None:
                log.tail.flush()
            log.flush_progress()
        with contextlib.suppress(Exception):
            self._tell_progress(self._job.state())

    def _pass(self, final: bool = False, reconnect: bool = True) -> bool:
        with self._polling:
            return self._read_all(final, reconnect and final)

    def _read_all(self, final: bool, reconnect: bool) -> bool:
        busy = False
        state = self._job.state()
        self._announce_relaunch(state)
        for log in self._logs:
            if log.phase not in self._active:
                continue
            if final:
                log.next_check = 0.0
            try:
                client = self._client(log.rank, reconnect)
                if client is None:
                    continue
                busy = log.poll(client, state) or busy
            except RemoteError:
                self._lost(log.rank)
                continue
            if log.new_generation and log.phase == "run":
                # A relaunch: replacement nodes run setup again before the run restarts on them.
                for other in self._logs:
                    if other.phase == "setup":
                        other.next_check = 0.0
        self._tell_progress(state)
        return busy

    def _tell_progress(self, state: JobState | None) -> None:
        """A `progress` event (the job's progress document, no histories) when a rank's record changed:
        the view shows one compact line instead of the report lines (which LogTail keeps from the sink)."""
        latest = {
            log.rank: log.progress.latest
            for log in self._logs
            if log.phase == "run" and log.progress is not None and log.progress.latest is not None
        }
        told = tuple((rank, id(record)) for rank, record in latest.items())
        if not latest or told == self._told:
            return
        self._told = told
        ranks = {rank: record for rank, record in latest.items() if record is not None}
        doc = summarize(ranks, state, time.time(), with_history=False)
        self._sink(Event("progress", "run_follow", None, data=doc))

    def _announce_relaunch(self, state: JobState | None) -> None:
        """Each recovery or restart, told once per generation: from the claim while it is being done, or
        from the job's history when it was quicker than a pass (the follow tasks' own messages go to the
        Airflow log only)."""
        if state is None:
            return
        told: list[tuple[int, str, str]] = [
            (int(e["generation"]), str(e["action"]), str(e["reason"])) for e in state.history
        ]
        if state.relaunch is not None:
            claim = state.relaunch
            told.append((claim.target, claim.action.value, claim.reason))
        for generation, action, reason in sorted(told):
            if generation > self._announced:
                self._announced = generation
                text = f"{action}: {reason}; relaunching the job as generation {generation}"
                self._sink(Event("relaunch", "run_follow", None, text))

    def _client(self, rank: int, reconnect: bool = False) -> NodeClient | None:
        if rank in self._clients:
            return self._clients[rank]
        if rank in self._down_until:
            if time.monotonic() < self._down_until[rank] and not reconnect:
                return None
            self._refresh_node(rank)  # the infra may have replaced it meanwhile (a recovery)
        self._clients[rank] = self.cluster.client(self._nodes[rank], conn_retry_attempts=1)
        return self._clients[rank]

    def _lost(self, rank: int) -> None:
        """A node stopped answering: reconnect later, to the node the infra then has at that rank."""
        client = self._clients.pop(rank, None)
        if client is not None:
            client.reset()
            client.close()
        self._down_until[rank] = time.monotonic() + _RECONNECT_S

    def _refresh_node(self, rank: int) -> None:
        with contextlib.suppress(Exception):
            current = {n.rank: n for n in self.cluster.nodes()}
            if rank in current:
                self._nodes[rank] = current[rank]
