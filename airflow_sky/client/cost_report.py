"""`airflow-sky cost-report`'s rows, as `sky cost-report`: every cluster on every infra configured here that
is up, stopped, or was torn down within the last `days`, with what it cost (the fleet ledger's node-hours
times the packaged catalog's price), asked of all infras at once within one deadline (cluster_search)."""

from __future__ import annotations

import time
from typing import Any

from airflow_sky.client import cluster_search


def cost_rows(days: float, infra: str | None = None) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(one row per cluster, newest launch first; [(infra, why it could not be asked)])."""
    from airflow_sky.gang.fleet import FleetReader

    now = time.time()
    since = now - days * 86400
    problems: list[tuple[str, str]]
    if infra is not None:
        infras, problems = [infra], []
    else:
        infras, problems = cluster_search.candidate_infras()
    rows: dict[str, list[dict[str, Any]]] = {}

    def probe(name: str, _: str) -> bool:
        try:
            cloud = cluster_search.configured_cloud(name)
        except cluster_search.NotConfigured:
            if infra is not None:  # the one infra asked for: say why it could not be
                raise
            return False
        rows[name] = FleetReader(cloud, name, with_progress=False).read(ended_since=since, now=now)
        return True

    answers = cluster_search._ask_all(probe, infras, "", cluster_search.SEARCH_TIMEOUT_S)
    problems = [*problems, *((i, why) for i, why in answers.items() if isinstance(why, str))]
    found = [row for name in infras for row in rows.get(name, [])]
    found.sort(key=lambda r: float(r.get("launched_at") or 0), reverse=True)
    return found, problems
