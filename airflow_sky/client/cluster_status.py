"""`status`'s rows, and `status -r` (sky's `--refresh`): every infra configured here asked for its clusters.

A plain `status` asks one infra (`--infra`, default local) or, for named clusters, the infra the index
names. With `refresh` every infra configured here is asked at once (local, each ssh pool of the pool files,
each cloud with its Airflow connection, as client/cluster_search.py asks them), within one deadline: the
rows are what the infras hold now, and this machine's index is brought up to date with them (a cluster
found on one infra is recorded there; one the index names on an infra that answered without it is
forgotten). An infra that could not be asked is one note on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sky.client import cluster_index, cluster_search
from airflow_sky.client.cluster_lookup import forget

if TYPE_CHECKING:  # loads Airflow, which engine.prepare_airflow must configure first
    from airflow_sky.infra.base import Node
    from airflow_sky.infra.cluster import Cluster


def not_found_row(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "infra": None,
        "status": "NOT_FOUND",
        "nodes": [],
        "autostop": None,
        "cost_per_hour": None,
        "idle_since": None,
        "owner": None,
    }


def fleet_fields(cluster: Cluster, up: bool) -> dict[str, Any]:
    """What the fleet ledger and the job records say of a cluster: its cost per hour now, since when it
    has been idle (an UP cluster without a live job), and who owns it. A ledger or job store that does not
    answer leaves them unknown: `status` still lists the cluster."""
    from airflow_sky.gang import state as js
    from airflow_sky.gang.fleet import idle_since
    from airflow_sky.infra import ledger

    try:
        record = cluster.ledger_record()
        states = js.JobStates(cluster.state_store()).all() if up else []
    except Exception:  # the nodes' statuses came from the infra; these are an aid
        return {"cost_per_hour": None, "idle_since": None, "owner": None}
    launched = float(record["launched_at"]) if record and record.get("launched_at") else None
    return {
        "cost_per_hour": ledger.cost_per_hour(record) if record else None,
        "idle_since": idle_since([s for s in states if not s.info.get(js.RUNS_NOTHING_KEY)], launched)
        if up
        else None,
        "owner": record.get("owner") if record else None,
    }


def status_row(cluster: Cluster, nodes: Sequence[Node]) -> dict[str, Any]:
    """A cluster's row; its autostop as armed, read where the infra keeps it (an UP cluster's only: a
    stopped node's watcher has acted, and a started one runs none until armed again)."""
    from airflow_sky.infra.base import Cloud

    if not nodes:
        return not_found_row(cluster.name) | {"infra": cluster.infra}
    states = sorted({n.status.value for n in nodes})
    summary = "UP" if states == ["RUNNING"] else ",".join(states)
    armable = type(cluster.cloud).autostop_action is not Cloud.autostop_action  # ssh pools: never armed
    return {
        "name": cluster.name,
        "infra": cluster.infra,
        "status": summary,
        "nodes": [n.to_dict() for n in nodes],
        "autostop": cluster.autostop_setting() if summary == "UP" and armable else None,
        **fleet_fields(cluster, summary == "UP"),
    }


def refreshed_status(cluster_names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every cluster (or those named) on every infra configured here, the index updated to match."""
    from airflow_sky.infra.cluster import Cluster
    from airflow_sky.infra.registry import get_cloud

    infras, problems = cluster_search.candidate_infras()
    listed: dict[str, list[str]] = {}
    answers = cluster_search._ask_all(_lister(listed), infras, "", cluster_search.SEARCH_TIMEOUT_S)
    problems += [(infra, why) for infra, why in answers.items() if isinstance(why, str)]
    for infra, why in problems:
        print(f"airflow-sky: note: status -r: {infra} could not be asked: {why}", file=sys.stderr)
    wanted = set(cluster_names or ())
    found: dict[str, list[str]] = {}
    rows = []
    for infra in infras:
        for name in listed.get(infra, ()):
            if wanted and name not in wanted:
                continue
            cloud = get_cloud(infra)
            rows.append(status_row(Cluster(name, infra, cloud), cloud.nodes(name)))
            found.setdefault(name, []).append(infra)
    for name, where in found.items():
        hint = cluster_index.infra_hint(name)
        if len(where) == 1 and not (hint and (hint == where[0] or hint.startswith(where[0] + "/"))):
            cluster_index.remember(name, where[0])  # (a region the index names is kept: `aws/us-east-1`)
    for name, infra in cluster_index.read_index().items():
        if name not in found and infra in listed:  # its infra answered, without it: gone
            forget(name)
    rows += [not_found_row(name) for name in cluster_names or () if name not in found]
    return rows


def _lister(listed: dict[str, list[str]]) -> Callable[[str, str], bool]:
    """A probe for cluster_search._ask_all that lists an infra's clusters into `listed` (False: the infra
    is not set up here, and is left out quietly)."""

    def probe(infra: str, _: str) -> bool:
        try:
            cloud = cluster_search.configured_cloud(infra)
        except cluster_search.NotConfigured:
            return False
        listed[infra] = list(cloud.clusters())
        return True

    return probe
