"""The Sky page's answer: every cluster, job and dollar on the configured infras, with what this user may do.

The data is SkyFleetHook's (each infra's ledger, membership and job records; nothing is read from a node);
this module shapes it for one user (pure, given the access checks): per cluster its age, idle time, cost
and events, the DAG run that owns it, and whether this user may stop / down it (edit access to the owning
DAG's runs; a cluster no DAG of this Airflow owns, such as one launched from a laptop's CLI, needs edit
access to every DAG); per job its run, progress and cost, and whether the user may cancel it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.app import API_ROOT_PATH

ENDED_JOBS_SHOWN = 100  # the newest ended jobs the page lists (every live one is listed)
EditCheck = Callable[[str | None], bool]  # dag_id (None: every DAG) -> may this user edit its runs


def run_url(dag_id: str | None, run_id: str | None) -> str | None:
    if not dag_id or not run_id:
        return None
    return f"{API_ROOT_PATH.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def owner_dag(owner: Mapping[str, Any] | None) -> str | None:
    """The DAG of this Airflow that owns a cluster (None for a CLI launch: its DAG ran in a private one)."""
    if not owner or owner.get("via") == "cli":
        return None
    dag_id = owner.get("dag_id")
    return str(dag_id) if dag_id else None


def _since(at: Any, now: float) -> float | None:
    return max(0.0, now - float(at)) if isinstance(at, int | float) else None


def shape(
    rows: Sequence[Mapping[str, Any]],
    notes: Sequence[tuple[str, str]],
    now: float,
    may_edit: EditCheck,
    catalog_as_of: str | None,
    readable: Callable[[str], bool] = lambda dag_id: True,
) -> dict[str, Any]:
    """The page's JSON for one user: what the DAGs they may not read own or submitted is left out (a
    cluster no DAG of this Airflow owns is everyone's to see)."""
    clusters: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    edits: dict[str | None, bool] = {}

    def editable(dag_id: str | None) -> bool:
        if dag_id not in edits:
            edits[dag_id] = may_edit(dag_id)
        return edits[dag_id]

    for row in sorted(
        rows, key=lambda r: (r.get("ended_at") is not None, str(r.get("infra")), str(r.get("cluster")))
    ):
        owner = row.get("owner") or {}
        dag = owner_dag(owner)
        if dag is not None and not readable(dag):
            continue
        live = row.get("ended_at") is None
        # On a cluster a DAG here owns, its jobs' DAGs are this Airflow's too; a CLI launch's are not.
        cluster_jobs = [
            j
            for j in row.get("jobs") or ()
            if dag is None or not j.get("dag_id") or readable(str(j["dag_id"]))
        ]
        clusters.append(
            {
                **{k: row.get(k) for k in ("cluster", "infra", "status", "nodes", "billing", "autostop")},
                **{
                    k: row.get(k)
                    for k in ("cost_per_hour", "cost", "launched_at", "ended_at", "events_dropped")
                },
                "owner": owner or None,
                "owner_url": run_url(owner_dag(owner), owner.get("run_id")),
                "age_s": _since(row.get("launched_at"), now) if live else None,
                "idle_s": _since(row.get("idle_since"), now),
                "events": [
                    {"at": e[0], "kind": e[1], "rank": e[2], "text": e[3]} for e in row.get("events") or ()
                ],
                "jobs": len(cluster_jobs),
                "live_jobs": sum(1 for j in cluster_jobs if j.get("status") not in _TERMINAL),
                "editable": live and row.get("status") != "NOT_FOUND" and editable(owner_dag(owner)),
            }
        )
        for job in cluster_jobs:
            dag_id = job.get("dag_id")
            jobs.append(
                {
                    **job,
                    "cluster": row.get("cluster"),
                    "infra": row.get("infra"),
                    "run_url": run_url(dag_id, job.get("run_id")),
                    "editable": job.get("status") not in _TERMINAL and editable(dag_id),
                }
            )
    up = [c for c in clusters if c["ended_at"] is None]
    jobs.sort(key=lambda j: str(j.get("submitted_at") or ""), reverse=True)
    live_jobs = [j for j in jobs if j.get("status") not in _TERMINAL]
    ended_jobs = [j for j in jobs if j.get("status") in _TERMINAL]
    known_costs = [float(c["cost"]) for c in clusters if c.get("cost") is not None]
    return {
        "generated_at": now,
        "catalog_as_of": catalog_as_of,
        "totals": {
            "clusters": len(up),
            "nodes": sum(int(c.get("nodes") or 0) for c in up),
            "cost_per_hour": sum(float(c.get("cost_per_hour") or 0.0) for c in up),
            "cost": sum(known_costs),
            "jobs_running": len(live_jobs),
            "jobs": len(jobs),
        },
        "clusters": clusters,
        # Every live job and the newest ended ones: a long-lived fleet's history would fill the page.
        "jobs": live_jobs + ended_jobs[:ENDED_JOBS_SHOWN],
        "jobs_hidden": max(0, len(ended_jobs) - ENDED_JOBS_SHOWN),
        "notes": [{"infra": infra, "why": why} for infra, why in notes],
    }


_TERMINAL = {"SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED"}
