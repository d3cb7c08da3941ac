"""`airflow-sky logs CLUSTER --hook`: what the cluster's lifecycle hooks printed, and how each ended."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def print_hook_runs(runs: Sequence[dict[str, Any]], cluster: str) -> int:
    """Each kept run, oldest first: a header, then each hook's verdict and output per rank. 0 when every
    hook of the latest run ended well (1 otherwise, and when there is none)."""
    if not runs:
        print(f"Cluster {cluster} has run no lifecycle hook (config.hooks run on stop, preemption and down).")
        return 1
    for run in runs:
        at = datetime.fromtimestamp(float(run.get("at") or 0), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"== {run.get('event')} hooks of job {run.get('job_id')}, {at} ==")
        for result in run.get("results") or []:
            print(f"(hook {result.get('hook')}, rank {result.get('rank')}) {_verdict(result)}")
            for line in str(result.get("output") or "").splitlines():
                print(f"(hook {result.get('hook')}, rank {result.get('rank')}) {line}")
    latest = runs[-1].get("results") or []
    return 0 if all(r.get("exit_code") == 0 and not r.get("timed_out") for r in latest) else 1


def _verdict(result: dict[str, Any]) -> str:
    if result.get("error"):
        return f"could not run: {result['error']}"
    if result.get("timed_out"):
        return f"ran out of its time after {float(result.get('seconds') or 0):.0f} s and was stopped"
    return f"exited {result.get('exit_code')} after {float(result.get('seconds') or 0):.1f} s"
