"""`exec` on a kept cluster without an Airflow DAG run: the same steps, in this process, in about a second.

An exec provisions nothing, runs no setup and keeps the cluster, so its DAG run is five quick steps whose
work is all in the gang core and the infra (what the operators call through SkyClusterHook): register the
job in the cluster's queue and wait for its turn (provision), send the task's files to every node (sync),
start every rank (launch), follow every rank to the phase's verdict, relaunching it where job_recovery
allows (run_follow), keep the result (collect) and release the job (teardown). Building and running that
DAG run in-process costs 8-12 s (importing Airflow, its in-process execution API, one task runner per task
instance) for a job of a second. This driver calls the same gang and infra functions directly and tells the
CLI the same events (steps, node log lines, exits, the job record), so `queue`, `logs`, Ctrl-C (handing
the job to the detached driver) and the exit codes are as with the DAG run. Every rank's follower runs in a
thread of its own, as a deployment's follow tasks run side by side: the phase's watch lease makes one of
them the watcher, and one leads a relaunch. What needs Airflow's connections (bucket mounts) or a teardown
that may end the cluster still goes through the DAG run (engine.run_job decides: `handles`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_sky.client import events
from airflow_sky.client.engine import JobOutcome
from airflow_sky.client.limits import raise_open_file_limit
from airflow_sky.errors import ClusterError, JobFailed
from airflow_sky.gang.cluster_down import release_cluster
from airflow_sky.gang.cluster_jobs import wait_in_queue
from airflow_sky.gang.gang_job import GangJob, RankFollower, Wake
from airflow_sky.gang.job import KILLED_EXIT_CODE, JobHandle, JobStatus
from airflow_sky.gang.job_progress import RankProgress, summarize
from airflow_sky.gang.phases import check_exec_nodes, job_states, register_job
from airflow_sky.gang.recovery import DEFAULT_MAX_RECOVERIES
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.task.launch import Launch
from airflow_sky.task.redaction import task_redactor
from airflow_sky.task.resources_effects import no_effect_warning
from airflow_sky.task.storage import has_bucket_mounts

FOLLOW_POLL_S = 0.2  # between a follower's rounds with nothing new (the follow task's: 0.5 s)


def handles(launch: Launch) -> bool:
    """Whether this driver runs the launch: an exec (no setup, no provisioning, the cluster kept) of a task
    without bucket mounts (their credentials come from Airflow connections), outside a pipeline."""
    options = launch.options
    return (
        options.must_exist
        and not options.down
        and not options.setup
        and not options.retry_until_up
        and options.pipeline_name is None
        and not has_bucket_mounts(launch.task)
    )


class _Failed(Exception):
    """A step failed; its task_failed event is told already."""


@dataclasses.dataclass
class DirectRun:
    """One exec's run: its cluster, its event sink (the engine's: redaction, node log order, listeners),
    its log (what the operators would have written into their task logs) and its submit key."""

    launch: Launch
    cluster: Cluster
    sink: events.Listener
    log: Callable[[str], None]
    redact: Callable[[str], str]
    submit_key: str
    handle: JobHandle | None = None
    progress: ProgressTeller = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.progress = ProgressTeller(self.sink)

    def step(self, name: str, work: Callable[[], Any], rank: int | None = None) -> Any:
        """Run one step as its task would: task_started, then task_done or task_failed (and _Failed)."""
        self.sink(events.Event("task_started", name, rank))
        try:
            value = work()
        except Exception as error:
            text = str(error) or type(error).__name__
            self.log(f"{name}{'' if rank is None else f'[{rank}]'} failed: {text}")
            self.sink(events.Event("task_failed", name, rank, text))
            raise _Failed(text) from error
        self.sink(events.Event("task_done", name, rank))
        return value

    def run(self) -> str:
        """The steps of the exec's DAG run; returns its state as the DAG run's ("success" or "failed")."""
        try:
            handle = self.handle = self.step("provision", self._provision)
        except _Failed:
            return "failed"  # nothing of the job's exists to tear down (as a teardown task's failed setup)
        self.sink(events.Event("job", "provision", data=handle.to_dict()))
        state = "failed"
        try:
            self._parallel([functools.partial(self._sync_step, node) for node in handle.nodes])
            job = GangJob.of(self.cluster, handle)
            self.step("launch", lambda: self._start(job))
            if not self.launch.options.follow:
                return "success"  # --detach-run: the DAG ends with launch (no follow, collect or teardown)
            ranks = [n.rank for n in handle.run_nodes] if self.launch.task.run is not None else []
            values = self._parallel(
                [functools.partial(self._follow_step, job, rank) for rank in ranks],
                on_error=lambda error: self._cancel_unless_judged(job, error),
            )
            self.step("collect", lambda: self._collect(job, handle))
            self.sink(events.Event("result", "collect", data={"value": values[0] if values else None}))
            state = "success"
        except _Failed:
            pass
        try:
            self.step("teardown", lambda: self._teardown(handle))
        except _Failed:
            state = "failed"
        return state

    # ---- the steps -----------------------------------------------------------------------------------

    def _provision(self) -> JobHandle:
        task, options, cluster = self.launch.task, self.launch.options, self.cluster
        warning = no_effect_warning("provision", task.resources, options.infra)
        if warning is not None:
            self.log(warning)
        cluster.autostop_for(task.resources)
        check_exec_nodes(cluster.name, options.infra, cluster.nodes(), task.num_nodes, "TASK.yaml")
        self.log(f"Reusing cluster {cluster.name} on {options.infra} ({task.num_nodes} nodes)")
        cluster.provision(task.num_nodes, task.resources, job_name=task.name, retry_until_up=False)
        nodes = cluster.running_nodes(task.num_nodes)
        cluster.arm_autostop(nodes, task.resources)
        handle = register_job(cluster, task, nodes, self.submit_key)
        self.log(f"Job {handle.job_id} on cluster {cluster.name} (SKYPILOT_TASK_ID={handle.sky_task_id})")
        wait_in_queue(cluster, task, handle, False, self.log)
        if task.resources.ports:
            found = cluster.endpoints()
            self.log("endpoints: " + ", ".join(f"{p}: {a}" for p, a in found.items()))
        return handle

    def _sync_step(self, node: Node) -> None:
        self.step("sync", lambda: self._sync(node), node.rank)

    def _sync(self, node: Node) -> None:
        from airflow_sky.node.files import upload_task_files
        from airflow_sky.task.container import inherited_container

        handle, task = self.handle, self.launch.task
        assert handle is not None
        container = inherited_container(task.container, handle.container_image)  # as the sync task's
        with self.cluster.client(node) as client:
            upload_task_files(
                client, task, self.log, None, git_commit=handle.git_commit, container=container,
                cluster_name=self.cluster.name,
            )  # fmt: skip

    def _start(self, job: GangJob) -> None:
        task, handle = self.launch.task, job.handle
        job.check_run_nodes()
        job.set_status(JobStatus.RUNNING)
        if task.run is None:
            self.log("The task has no run section; nothing to start")
            return
        for start in job.start_all(task, "run", [n.rank for n in handle.run_nodes]):
            if start.skipped:
                self.log(f"Nothing started on rank {start.rank}: {start.skipped}")
            elif start.lost:
                self.log(f"The node of rank {start.rank} is gone: the followers will recover the job")
            else:
                self.log(f"{'Started' if start.started else 'Attached to'} the run on rank {start.rank}")

    def _follow_step(self, job: GangJob, rank: int) -> Any:
        """The follow step of `rank`, then its exit event (as the engine's listener tells a follow task's)."""
        try:
            value = self.step("run_follow", lambda: self._follow(job, rank), rank)
        except _Failed as failed:
            error = failed.__cause__
            code = error.exit_code if isinstance(error, JobFailed) else None
            if isinstance(error, JobFailed) and not (error.rank == rank or code == KILLED_EXIT_CODE):
                code = None
            self.sink(events.Event("exit", "run_follow", rank, str(failed), exit_code=code))
            raise
        self.sink(events.Event("exit", "run_follow", rank, exit_code=0))
        return value

    def _follow(self, job: GangJob, rank: int) -> Any:
        """One rank's follow task (operators.phase.SkyFollowOperator) without Airflow: its node's lines go
        to the log file (the live view shows them from the sink), its verdict is an exit event."""
        task = self.launch.task
        owner = f"cli-{os.getpid()}/{job.job_id}/run_follow/{rank}"
        triage = GangJob.triage(task.job_recovery, DEFAULT_MAX_RECOVERIES)
        generation = job.generation("run")
        while True:
            nodes = job.phase_nodes("run", job.state())
            follower = job.follower(
                "run", generation, rank, nodes, owner, emit=self._emitter(rank), triage=triage, log=self.log,
            )  # fmt: skip
            try:
                step = follower.run(FOLLOW_POLL_S, lambda f: self.progress.tell(rank, f, job))
                if step.wake is Wake.RELAUNCH:
                    self.log(step.reason)
                    generation = job.relaunch(task, generation, owner, self._relaunch_log(rank)).generation
                    continue
                follower.release_watch()
                if step.wake is Wake.FAILED:
                    assert step.error is not None
                    newer = job.generation("run")
                    if newer > generation:  # relaunched, and that ended before this follower looked
                        generation = newer
                        continue
                    raise step.error
                self.progress.tell(rank, follower, job)  # its last reports
                return job.read_result(follower.own, self.redact)
            finally:
                follower.close()

    def _relaunch_log(self, rank: int) -> Callable[[str], None]:
        """What a relaunch says goes to the log file; the replacement node's setup lines (the leader streams
        them, `(setup worker1, rank=1, ...)`) reach the terminal too, as the DAG run's live view shows them."""

        def log(line: str) -> None:
            self.log(line)
            if line.startswith("(setup "):
                self.sink(events.Event("log", "setup_follow", rank, self.redact(line)))

        return log

    def _emitter(self, rank: int) -> Callable[[str], None]:
        return lambda line: self.sink(events.Event("log", "run_follow", rank, self.redact(line)))

    def _cancel_unless_judged(self, job: GangJob, error: BaseException) -> None:
        """A follower that failed for another reason than the job's verdict (a lost connection, a bug): the
        others must not follow a job nobody watches to its end; as a failed follow task's siblings, they
        end with it cancelled."""
        if not isinstance(error.__cause__, JobFailed):
            job.cancel_everywhere(f"the follower of a rank failed in the CLI: {error}")

    def _collect(self, job: GangJob, handle: JobHandle) -> None:
        job.set_status(JobStatus.SUCCEEDED)  # the run's verdict wrote it already, as a rule
        self.log(f"Job {handle.job_id} on {handle.cluster_name} succeeded on {handle.num_run_nodes} nodes")

    def _teardown(self, handle: JobHandle) -> None:
        release = release_cluster(job_states(self.cluster), handle.job_id, False, self.log)
        if release.terminate:  # never asked for (down=False); said, not done
            raise ClusterError(f"cluster {handle.cluster_name}: an exec's teardown was asked to end it")
        job = GangJob.of(self.cluster, handle)
        state = job.state()
        if state is not None and not state.status.is_terminal:
            reason = "its launcher's steps ended before the job did (a step failed)"
            self.log(f"Job {handle.job_id} is {state.status.value} but {reason}: cancelling it")
            job.cancel_everywhere(reason)
        self.log(f"Keeping cluster {handle.cluster_name} (down=False)")

    # ---- helpers -------------------------------------------------------------------------------------

    @staticmethod
    def _parallel(
        work: list[Callable[[], Any]], on_error: Callable[[BaseException], Any] | None = None
    ) -> list[Any]:
        """Run every callable in a thread of its own; their values in order. The first step that fails
        calls `on_error` at once (the others' followers then end too) and is raised once all are done."""
        if not work:
            return []
        failed: list[BaseException] = []
        lock = threading.Lock()

        def run(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except BaseException as error:
                with lock:
                    first = not failed
                    failed.append(error)
                if first and on_error is not None:
                    with contextlib.suppress(Exception):  # the step failed already; this only hastens the end
                        on_error(error)
                raise

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(work)) as pool:
            futures = [pool.submit(run, fn) for fn in work]
            concurrent.futures.wait(futures)
        if failed:
            raise failed[0]
        return [f.result() for f in futures]


class ProgressTeller:
    """The job's progress as `progress` events, whenever a rank's record changed (the live view's compact
    line; client.live.NodeLogs tells it so for a DAG run): each follower hands its rank's latest record."""

    def __init__(self, sink: events.Listener) -> None:
        self._sink = sink
        self._latest: dict[int, RankProgress] = {}
        self._told: tuple[tuple[int, int], ...] = ()
        self._lock = threading.Lock()

    def tell(self, rank: int, follower: RankFollower, job: GangJob) -> None:
        record = follower.progress.latest if follower.progress is not None else None
        with self._lock:
            if record is not None:
                self._latest[rank] = record
            told = tuple((r, id(p)) for r, p in sorted(self._latest.items()))
            if not self._latest or told == self._told:
                return
            self._told = told
            latest = dict(self._latest)
        try:
            doc = summarize(latest, job.state(), time.time(), with_history=False)
        except Exception:  # progress never fails the job (as the follow task's gauges)
            return
        self._sink(events.Event("progress", "run_follow", None, data=doc))


def log_writer(log_file: Path, redact: Callable[[str], str]) -> Callable[[str], None]:
    """Timestamped, redacted lines appended to the launch's log (0600: it may name anything)."""
    lock = threading.Lock()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)

    def write(message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        text = "".join(f"[{stamp}] {line}\n" for line in redact(message).splitlines() or [""])
        with lock, open(log_file, "a") as f:
            f.write(text)

    return write


def run_exec(launch: Launch, listener: events.Listener | None = None) -> JobOutcome:
    """Run the exec to its end in this process (engine.run_job's contract, without Airflow)."""
    from airflow_sky.client import engine
    from airflow_sky.client.queue_watch import QueueWatch
    from airflow_sky.infra.registry import open_cluster

    task, options = launch.task, launch.options
    raise_open_file_limit(task.num_nodes)
    cluster = open_cluster(options.cluster_name, options.infra)
    log_dir = engine.private_airflow_home() / "logs" / "launch"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{cluster.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    engine.launch_state()["log_file"] = log_file  # for Ctrl-C: the detached driver logs there
    redact = task_redactor(task)
    recorder = engine.Recorder()
    receivers: list[events.Listener] = [recorder] if listener is None else [recorder, listener]
    lock = threading.RLock()  # events come from every rank's follower thread

    def sink(event: events.Event) -> None:
        if event.text and event.kind != "log":  # node log lines come redacted; errors may quote anything
            event = dataclasses.replace(event, text=redact(event.text))
        with lock:
            for receive in receivers:
                receive(event)

    dag_id = engine.dag_id_for(cluster.name)  # the job's submit key names it, as a DAG run's would
    write = log_writer(log_file, redact)
    write(f"airflow-sky exec on {cluster.name} ({options.infra}) without an Airflow DAG run ({dag_id})")
    run = DirectRun(launch, cluster, sink, write, redact, submit_key=f"{dag_id}/direct/job.provision")
    watch = QueueWatch(cluster, dag_id, sink)
    watch.start()
    try:
        state = run.run()
    finally:
        watch.stop()
        engine.launch_state().pop("log_file", None)
    write(f"the exec's steps ended: {state}")
    return recorder.outcome(state, cluster.name, log_file, by_airflow=False)
