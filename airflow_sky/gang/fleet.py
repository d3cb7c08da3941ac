"""The fleet as the Sky page, `status` and `cost-report` see it: one infra's clusters, read from what the
infra keeps (its ledger, its membership, the clusters' job and progress records), never from a node.

`read_infra` gives one view per cluster: the ledger's owner, billing, spans and events, the infra's node
statuses, the jobs and their progress. Where the infra disagrees with the ledger (nodes a watcher stopped,
a cluster that downed itself) the ledger is brought up to date here, with the event, since no other code
saw it happen. The actions (`down_idle`, `stop`, `cancel_job`) are what a user may do from the page.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.gang import state as js
from airflow_sky.gang.lifecycle import run_hooks
from airflow_sky.gang.progress_store import ProgressRecords
from airflow_sky.infra import ledger
from airflow_sky.infra.base import Cloud, Node, NodeStatus
from airflow_sky.infra.cluster import Cluster

MANAGED_DAG_ID = "airflow_sky_jobs"  # the managed-jobs DAG (dags.managed): its jobs are managed jobs
READ_THREADS = 16  # clusters read at once per infra (each is a few store reads and one membership read)
STOP_WAIT_S = 600.0  # a cloud VM takes minutes to stop
JOB_FIELDS = ("job_id", "name", "status", "submitted_at", "started_at", "ended_at", "submit_key", "num_nodes")


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def job_view(
    state: js.JobState, progress: dict[str, Any] | None, hourly_per_node: float | None, now: float
) -> dict[str, Any]:
    """One job's row: its record's fields, DAG run, recoveries, progress and goodput, cost so far (pure)."""
    record = state.to_record()
    row = {k: record.get(k) for k in JOB_FIELDS}
    dag_id, _, rest = str(record.get("submit_key") or "").partition("/")
    run_id, _, task_id = rest.rpartition("/")
    row.update(
        dag_id=dag_id or None,
        run_id=run_id or None,
        task_id=task_id or None,
        recoveries=state.recoveries,
        generation=state.generation,
        managed=dag_id == MANAGED_DAG_ID,
    )
    start = _epoch(state.info.get("started_at")) or _epoch(state.info.get("submitted_at"))
    end = _epoch(state.info.get("ended_at")) if state.status.is_terminal else None
    if state.status.is_terminal and end is None:
        end = start
    node_s = max(0.0, ((end or now) - start)) * state.num_nodes if start is not None else 0.0
    row["cost"] = None if hourly_per_node is None else hourly_per_node * node_s / 3600.0
    if progress:
        row["progress"] = {
            k: progress.get(k) for k in ("step", "total", "percent", "eta_s", "metrics") if k in progress
        }
        goodput = progress.get("goodput")
        row["goodput"] = goodput.get("ratio") if isinstance(goodput, dict) else None
    return row


def idle_since(states: Sequence[js.JobState], launched_at: float | None) -> float | None:
    """When the cluster last had a live job (None: one is live now). A cluster that never ran one is idle
    since it was launched."""
    if any(not s.status.is_terminal for s in states):
        return None
    ends = [_epoch(s.info.get("ended_at")) or _epoch(s.info.get("submitted_at")) for s in states]
    known = [e for e in ends if e is not None]
    return max(known) if known else launched_at


def cluster_status(nodes: Sequence[Node]) -> str:
    if not nodes:
        return "NOT_FOUND"
    states = sorted({n.status.value for n in nodes})
    return "UP" if states == ["RUNNING"] else ",".join(states)


class FleetReader:
    """One infra's clusters: `read` gives a view per cluster, live ones and (with `ended_since`) those torn
    down since then."""

    def __init__(self, cloud: Cloud, infra: str, with_progress: bool = True) -> None:
        self.cloud = cloud
        self.infra = infra
        self.with_progress = with_progress
        self.ledger = ledger.Ledger(cloud.state_store(ledger.STORE))

    def read(self, ended_since: float | None = None, now: float | None = None) -> list[dict[str, Any]]:
        now = time.time() if now is None else now
        records = {r["cluster"]: r for r in self.ledger.live()}
        names = sorted({*records, *self.cloud.clusters()})
        threads = max(1, min(READ_THREADS, self.cloud.concurrent_reads, len(names)))
        if threads == 1:
            views = [self._view(n, records.get(n), now) for n in names]
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                views = list(pool.map(lambda n: self._view(n, records.get(n), now), names))
        rows = [v for v in views if v is not None]
        if ended_since is not None:
            rows += [self._ended_view(r, now) for r in self.ledger.ended(ended_since)]
        return rows

    def _view(self, name: str, record: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
        cluster = Cluster(name, self.infra, self.cloud)
        nodes = self.cloud.nodes(name)
        record = self._reconciled(cluster, nodes, record)
        if record is not None and record.get("ended_at") is not None:
            return None  # it went down since the ledger was read (shown under ended, if asked)
        states = js.JobStates(cluster.state_store()).all() if nodes else []
        hourly = ledger.hourly_per_node(record) if record else 0.0
        progress = ProgressRecords(cluster.state_store()) if self.with_progress else None
        jobs = [
            job_view(
                s,
                progress.summary(s, now, with_history=False)
                if progress is not None and not s.status.is_terminal and not s.info.get(js.RUNS_NOTHING_KEY)
                else None,
                hourly,
                now,
            )
            for s in states
            if not s.info.get(js.RUNS_NOTHING_KEY)
        ]
        launched = float(record["launched_at"]) if record and record.get("launched_at") else None
        idle = idle_since(states, launched)
        status = cluster_status(nodes)
        return {
            "cluster": name,
            "infra": record.get("infra") if record else self.infra,
            "status": status,
            "nodes": len(nodes),
            "node_statuses": {str(n.rank): n.status.value for n in nodes},
            "billing": record.get("billing") if record else None,
            "owner": record.get("owner") if record else None,
            "launched_at": launched,
            "ended_at": None,
            "idle_since": idle if status == "UP" else None,
            "autostop": cluster.autostop_setting() if status == "UP" else None,
            "cost_per_hour": ledger.cost_per_hour(record) if record else None,
            "cost": ledger.cost(record, now) if record else None,
            "events": list(record.get("events", [])) if record else [],
            "events_dropped": int(record.get("events_dropped", 0)) if record else 0,
            "jobs": jobs,
        }

    def _ended_view(self, record: dict[str, Any], now: float) -> dict[str, Any]:
        return {
            "cluster": record.get("cluster"),
            "infra": record.get("infra") or self.infra,
            "status": "TERMINATED",
            "nodes": 0,
            "node_statuses": {},
            "billing": record.get("billing"),
            "owner": record.get("owner"),
            "launched_at": record.get("launched_at"),
            "ended_at": record.get("ended_at"),
            "idle_since": None,
            "autostop": None,
            "cost_per_hour": 0.0,
            "cost": ledger.cost(record, now),
            "events": list(record.get("events", [])),
            "events_dropped": int(record.get("events_dropped", 0)),
            "jobs": [],
        }

    def _reconciled(
        self, cluster: Cluster, nodes: Sequence[Node], record: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The ledger brought up to date with what the infra says, where they disagree (module doc)."""
        fleet = self.ledger
        if record is None:
            if any(n.status is NodeStatus.RUNNING for n in nodes):
                # Up before the ledger was kept, or its provision's write failed: on the bill from now.
                cluster.record_provisioned(nodes, None, "found up (not provisioned through the ledger)")
                return fleet.get(cluster.name)
            return None
        if not nodes:
            how = "its autostop ended it (autodown)" if cluster.autostop_setting() else "its nodes are gone"
            fleet.safely(
                "reconcile", lambda: fleet.torn_down(cluster.name, f"{how}: found by the fleet reader")
            )
            return fleet.get(cluster.name)
        open_ranks = ledger.open_ranks(record)
        stopped = [n.rank for n in nodes if n.rank in open_ranks and n.status is NodeStatus.STOPPED]
        if stopped:
            kind = "autostopped" if cluster.autostop_setting() else "stopped"
            ranks = ", ".join(map(str, stopped))
            fleet.safely(
                "reconcile",
                lambda: fleet.off_the_bill(cluster.name, kind, f"rank(s) {ranks} found stopped", stopped),
            )
            return fleet.get(cluster.name)
        return record


# ---- what a user may do from the page -----------------------------------------------------------------


def live_jobs(cluster: Cluster) -> list[int]:
    return [s.job_id for s in js.JobStates(cluster.state_store()).all() if not s.status.is_terminal]


def down_idle(cluster: Cluster, log: Callable[[str], None], by: str) -> None:
    """Tear down a cluster no job uses (`down` hooks first); one with a live job is refused."""
    if not cluster.nodes():
        raise ClusterError(f"cluster {cluster.name!r} does not exist on {cluster.infra}")
    busy = live_jobs(cluster)
    if busy:
        raise ClusterError(
            f"cluster {cluster.name!r} is not idle: job(s) {', '.join(map(str, busy))} run on it; cancel them first"
        )
    run_hooks(cluster, "down", log)
    cluster.record_event("down", f"down requested by {by}")
    cluster.terminate()


def stop(
    cluster: Cluster, log: Callable[[str], None], by: str | None = None, wait_s: float = STOP_WAIT_S
) -> bool:
    """Stop every node, keeping its disks (`sky stop`), the `stop` hooks first. False when every node was
    stopped already. The nodes stop themselves as autostop stops them: only infras with autostop can."""
    nodes = cluster.nodes()
    if not nodes:
        raise ClusterError(f"cluster {cluster.name!r} does not exist on {cluster.infra}")
    if all(n.status is NodeStatus.STOPPED for n in nodes):
        return False
    try:
        action = cluster.cloud.autostop_action(cluster.name, down=False)
        cluster.cloud.prepare_autostop(cluster.name, down=False)
    except ClusterError as e:
        first = str(e).split(";", 1)[0].split(": ", 1)[-1]
        raise ClusterError(
            f"cannot stop cluster {cluster.name!r}: the {cluster.infra} infra cannot stop its nodes "
            f"({first}); end it with: airflow-sky down {cluster.name}"
        ) from e
    running = [n for n in nodes if n.status is NodeStatus.RUNNING]
    run_hooks(cluster, "stop", log, nodes=running)
    for node in running:
        with cluster.client(node) as client:
            rc, _, err = client.exec(
                f"nohup sh -c {shlex.quote('sleep 1; ' + action)} >/dev/null 2>&1 &", timeout=60
            )
        if rc != 0:
            raise ClusterError(f"could not stop rank {node.rank}: {err.decode(errors='replace').strip()}")
    deadline = time.monotonic() + wait_s
    while True:
        now = cluster.nodes()
        if now and all(n.status is NodeStatus.STOPPED for n in now):
            break
        if time.monotonic() > deadline:
            states = ", ".join(f"rank {n.rank}: {n.status.value}" for n in now)
            raise ClusterError(f"cluster {cluster.name!r} did not stop within {wait_s:.0f}s ({states})")
        time.sleep(1.0)
    cluster.record_off_the_bill("stopped", f"stopped ({len(running)} node(s))" + (f" by {by}" if by else ""))
    return True


def job_dag(cluster: Cluster, job_id: int) -> str | None:
    state = js.JobStates(cluster.state_store()).get(job_id)
    if state is None:
        return None
    dag_id = str(state.info.get("submit_key") or "").partition("/")[0]
    return dag_id or None


def cancel_job(cluster: Cluster, job_id: int, by: str) -> bool:
    """Cancel one job on the cluster (its ranks stopped, its follow tasks fail); False when it had ended."""
    from airflow_sky.gang.cluster_jobs import ClusterJobs

    with ClusterJobs(cluster) as jobs:
        state = jobs.states.get(job_id)
        if state is None:
            raise ClusterError(f"cluster {cluster.name!r} has no job {job_id}")
        if state.status.is_terminal:
            return False
        done = bool(jobs.cancel([job_id], reason=f"cancelled by {by} from the Sky page"))
    if done:
        cluster.record_event("job cancelled", f"job {job_id} cancelled by {by}")
    return done
