"""Lifecycle hooks, run: before a cluster stops or is torn down, and on a node about to be preempted.

The hooks come from the job state (the cluster's newest job whose task declared `config.hooks`: a job on a
kept cluster may be followed by execs that declare none), never from a file on a node: a later job on the
cluster can write the nodes' files, and a hook runs with the declaring job's envs and secrets. The worker
sends each hook's script with the start, as it sends a job's.

Each hook runs as a detached job of its own on every running node (`hook-<event>-<stamp>-<n>`: the same
wrapper, env file, container and kill-by-mark as a job's run), the nodes side by side, one hook after the
other in declaration order. A hook that fails or outlives its timeout (then SIGTERM, SIGKILL after a grace)
is a warning: the event goes on. What each printed (its tail, secrets hidden) is kept in the cluster's
state store for `airflow-sky logs --hook` (the nodes may be gone by then) and logged by the caller.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.gang import state as js
from airflow_sky.infra.base import Node, NodeStatus
from airflow_sky.node import jobs
from airflow_sky.node.container import container_name
from airflow_sky.node.notice import HOOKS_DIR, NoticeWatch
from airflow_sky.node.paths import JOBS_DIR
from airflow_sky.task import envs
from airflow_sky.task.hooks import HookEvent, LifecycleHook, for_event, hook_env, hooks_from_dicts

if TYPE_CHECKING:
    from airflow_sky.gang.job import JobHandle
    from airflow_sky.infra.cluster import Cluster
    from airflow_sky.task import Task

HOOKS_INFO_KEY = "hooks"  # in a job's info: its task's hooks (run, events, timeout)
HOOK_ENVS_INFO_KEY = "hook_envs"  # and its envs (never its secrets: those exist only where the task is)
RUNS_PREFIX = "hook-runs"  # state store: one record per hook run, hook-runs/<event>-<stamp>
OUTPUT_TAIL_BYTES = 32 * 1024  # of each node's output, kept per hook
KILL_GRACE_S = 5.0
TIMED_OUT_EXIT = 124  # as timeout(1)
_POLL_S = 0.5


def hook_info(task: Task) -> dict[str, Any]:
    """What a job's record keeps for its hooks (nothing for a task without)."""
    if not task.hooks:
        return {}
    return {HOOKS_INFO_KEY: [h.to_dict() for h in task.hooks], HOOK_ENVS_INFO_KEY: dict(task.envs)}


def notice_watch(cluster: Cluster, task: Task) -> dict[str, Any]:
    """`start_job`'s arguments for a run that acts on its node's preemption notice (node.notice): the
    infra's check and the task's preemption hooks; nothing where the infra gives no notice."""
    check = cluster.cloud.notice_check(cluster.name)
    if check is None:
        return {}
    hooks = for_event(task.hooks, "preemption")
    return {
        "notice": NoticeWatch(
            check=check,
            hook_timeouts=tuple(h.timeout for h in hooks),
            interval_s=cluster.cloud.notice_interval_s,
        ),
        "preemption_hooks": tuple(h.run for h in hooks),
    }


@dataclasses.dataclass(frozen=True)
class HookResult:
    """One hook on one node."""

    hook: int  # its place in config.hooks (1-based, as users count them)
    rank: int
    exit_code: int | None  # None: it could not be started (the node did not answer)
    seconds: float
    timed_out: bool
    output: str  # its tail
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def describe(self, event: str) -> str:
        what = f"hook {self.hook} ({event}) on rank {self.rank}"
        if self.error:
            return f"{what} could not run: {self.error}"
        if self.timed_out:
            return f"{what} ran out of its time ({self.seconds:.0f} s) and was stopped"
        return f"{what} exited {self.exit_code} after {self.seconds:.1f} s"


def declaring_job(states: js.JobStates) -> js.JobState | None:
    """The cluster's newest job whose task declared hooks (None: the cluster has none to run)."""
    for state in sorted(states.all(), key=lambda s: s.job_id, reverse=True):
        if state.info.get(HOOKS_INFO_KEY):
            return state
    return None


def run_hooks(
    cluster: Cluster,
    event: HookEvent,
    log: Callable[[str], None],
    task: Task | None = None,
    job_id: int | None = None,
    nodes: Sequence[Node] | None = None,
) -> list[HookResult]:
    """Run the hooks for `event` on `nodes` (default: every running node of the cluster); log what each did
    and warn for each that failed. Never raises: the event goes on whatever the hooks do.

    `task`, `job_id`: the caller's job and its task (a DAG's teardown): when that job declared the hooks,
    its secrets join their env and are hidden in what is kept. Otherwise the hooks get the declaring task's
    envs only (its secrets were never stored).
    """
    try:
        return _run_hooks(cluster, event, log, task, job_id, nodes)
    except Exception as e:  # a stop or down goes on: the hooks are the user's, the event is not
        log(f"WARNING: the {event} hooks could not run ({type(e).__name__}: {e}); going on")
        return []


def _run_hooks(
    cluster: Cluster,
    event: HookEvent,
    log: Callable[[str], None],
    task: Task | None,
    job_id: int | None,
    nodes: Sequence[Node] | None,
) -> list[HookResult]:
    states = js.JobStates(cluster.state_store())
    state = declaring_job(states)
    hooks = for_event(hooks_from_dicts(state.info.get(HOOKS_INFO_KEY)) if state else (), event)
    if state is None or not hooks:
        return []
    if nodes is None:
        nodes = [n for n in cluster.nodes() if n.status is NodeStatus.RUNNING]
    if not nodes:
        return []
    if job_id != state.job_id:
        task = None  # another job's secrets never reach these hooks
    user = {**state.info.get(HOOK_ENVS_INFO_KEY, {}), **(task.envs_and_secrets if task is not None else {})}
    hide: Callable[[str], str] = task.hide_secrets if task is not None else str
    ordered = sorted(nodes, key=lambda n: n.rank)
    ips = [n.internal_ip for n in ordered]
    info = envs.cluster_info_json(cluster.info())
    task_id = str(state.info.get("sky_task_id") or "")
    stamp = time.time_ns() // 1_000_000
    log(f"Running {len(hooks)} {event} hook(s) of job {state.job_id} on {len(ordered)} node(s)")
    with ThreadPoolExecutor(max_workers=min(16, len(ordered)), thread_name_prefix="airflow-sky-hook") as pool:
        futures = [
            pool.submit(
                _run_on_node,
                cluster,
                node,
                hooks,
                hook_env(user, ips, node.rank, info, task_id, event),
                f"hook-{event}-{stamp}",
                state.info.get("container_image") is not None,
                hide,
            )
            for node in ordered
        ]
        concurrent.futures.wait(futures)
    results = sorted((r for f in futures for r in f.result()), key=lambda r: (r.hook, r.rank))
    for result in results:
        for line in result.output.splitlines():
            log(f"(hook {result.hook} {event}, rank {result.rank}) {line}")
        log(("" if result.ok else "WARNING: ") + result.describe(event) + ("" if result.ok else "; going on"))
    _keep(states, event, stamp, state.job_id, results)
    return results


def _run_on_node(
    cluster: Cluster,
    node: Node,
    hooks: Sequence[LifecycleHook],
    env: Mapping[str, str],
    prefix: str,
    in_container: bool,
    hide: Callable[[str], str],
) -> list[HookResult]:
    """Every hook, in order, on one node: one connection; a node that cannot be reached fails each hook."""
    results = []
    try:
        with cluster.client(node, conn_retry_attempts=1) as client:
            container = container_name(node) if in_container else None
            for i, hook in enumerate(hooks, start=1):
                results.append(_run_one(client, i, hook, env, f"{prefix}-{i}", container, hide))
    except (RemoteError, ClusterError, OSError) as e:
        done = {r.hook for r in results}
        results += [
            HookResult(i, node.rank, None, 0.0, False, "", error=hide(str(e)) or type(e).__name__)
            for i in range(1, len(hooks) + 1)
            if i not in done
        ]
    return results


def _run_one(
    client: Any,
    index: int,
    hook: LifecycleHook,
    env: Mapping[str, str],
    job_id: str,
    container: str | None,
    hide: Callable[[str], str],
) -> HookResult:
    started = time.monotonic()
    jobs.start_job(client, job_id, hook.run, env, container=container)
    tail = b""
    offset = 0
    timed_out = False
    exit_code: int | None = None
    while True:
        poll = jobs.read_job(client, job_id, 0, offset, want_pid=False)
        tail = (tail + poll.data)[-OUTPUT_TAIL_BYTES:]
        offset = poll.next_offset
        if poll.exit_code is not None and poll.caught_up:
            exit_code = poll.exit_code
            break
        if time.monotonic() - started >= hook.timeout:
            timed_out = True
            exit_code = jobs.kill_job(
                client, job_id, 0, signal.SIGTERM, grace_s=KILL_GRACE_S, record_exit_code=TIMED_OUT_EXIT
            )
            tail = (tail + jobs.read_job(client, job_id, 0, offset, want_pid=False).data)[-OUTPUT_TAIL_BYTES:]
            break
        if poll.caught_up:
            time.sleep(_POLL_S)
    return HookResult(
        hook=index,
        rank=client.node.rank,
        exit_code=exit_code,
        seconds=time.monotonic() - started,
        timed_out=timed_out,
        output=hide(tail.decode(errors="replace")),
    )


def _keep(states: js.JobStates, event: str, stamp: int, job_id: int, results: Sequence[HookResult]) -> None:
    """The run's record for `logs --hook` (best effort: the store may be on its way out with the cluster)."""
    record = {
        "event": event,
        "at": stamp / 1000,
        "job_id": job_id,
        "results": [dataclasses.asdict(r) for r in results],
    }
    with contextlib.suppress(ClusterError, OSError):
        states.store.put(f"{RUNS_PREFIX}/{event}-{stamp}", record, None)


def keep_preemption_hooks(
    cluster: Cluster, node: Node, task: Task, handle: JobHandle, generation: int
) -> None:
    """Keep what the preemption hooks of `node` printed (node.notice ran them there, in the run's wrapper)
    for `logs --hook`, while the node is still up. Best effort: the node may go at any moment. The files
    are the job's to write: they are shown, never believed."""
    hooks = for_event(task.hooks, "preemption")
    if not hooks:
        return
    base = f"{JOBS_DIR}/{handle.remote_job_id('run')}/gen-{int(generation)}/{HOOKS_DIR}/preemption"
    results = []
    with contextlib.suppress(RemoteError, ClusterError, OSError), cluster.client(node, 1) as client:
        for i in range(1, len(hooks) + 1):
            read = client.read_range(f"{base}-{i}.log", 0, OUTPUT_TAIL_BYTES)
            words = (client.read_file(f"{base}-{i}.rc", 64) or b"").split()
            code = int(words[0]) if words and words[0].isdigit() else None
            seconds = float(words[1]) if len(words) > 1 and words[1].isdigit() else 0.0
            output = task.hide_secrets(read[0].decode(errors="replace")) if read else ""
            results.append(HookResult(i, node.rank, code, seconds, code in (124, 137), output))
    if results:
        _keep(
            js.JobStates(cluster.state_store()),
            "preemption",
            time.time_ns() // 1_000_000,
            handle.job_id,
            results,
        )


def hook_runs(cluster: Cluster) -> list[dict[str, Any]]:
    """Every hook run the cluster's store keeps, oldest first."""
    store = cluster.state_store()
    keys = store.keys(RUNS_PREFIX)
    records = [store.get(k) for k in keys]
    runs = [r.data for r in records if r is not None]
    return sorted(runs, key=lambda r: float(r.get("at") or 0))
