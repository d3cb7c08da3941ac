"""A stand-in Airflow REST API with state, for the managed jobs commands: runs of the managed jobs DAG
(created with a unique run id and logical date: a taken one answers 409, checked and inserted under one
lock, as the database's unique keys do; listed newest first, or by logical date, with Airflow's filters;
patched), Variables, the runs' task instances and audit log entries as a test sets them. Real sockets and
real httpx; every request is recorded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.cli.stand_in import answer_json

RUNS = "/api/v2/dags/airflow_sky_jobs/dagRuns"


class Airflow:
    """What the stand-in holds: `runs` (newest last), `tis` and `event_logs` per run id, `variables`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.variables: dict[str, str] = {}
        self.runs: list[dict[str, Any]] = []
        self.tis: dict[str, list[dict[str, Any]]] = {}
        self.event_logs: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[str] = []

    def run(self, run_id: str) -> dict[str, Any] | None:
        return next((r for r in self.runs if r["dag_run_id"] == run_id), None)

    def add_run(self, run_id: str, state: str, conf: dict[str, Any] | None = None, **fields: Any) -> None:
        self.runs.append(
            {
                "dag_run_id": run_id,
                "logical_date": None,
                "state": state,
                "queued_at": "2026-12-03T10:00:00Z",
                "start_date": "2026-12-03T10:00:01Z",
                "end_date": None if state in ("queued", "running") else "2026-12-03T10:00:05Z",
                "conf": conf or {"task": {"name": run_id, "num_nodes": 1}, "infra": "local", "secrets": []},
                "note": None,
                **fields,
            }
        )


class Handler(BaseHTTPRequestHandler):
    airflow: Airflow

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        airflow = self.airflow
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        with airflow.lock:
            airflow.requests.append(f"{method} {self.path}")
            answer = self._answer(method, path, query, body)
        if answer is None:
            answer_json(self, {"detail": "not found"}, 404)
        else:
            answer_json(self, answer[1], answer[0])

    def _answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        airflow = self.airflow
        if path.startswith("/auth/token"):
            return 201, {"access_token": "t"}
        if path == "/api/v2/dags/airflow_sky_jobs":
            return 200, {"dag_id": "airflow_sky_jobs", "is_paused": False, "is_stale": False}
        if path == "/api/v2/variables" and method == "POST":
            if body["key"] in airflow.variables:
                return 409, {"detail": f"The Variable with key: `{body['key']}` already exists"}
            airflow.variables[body["key"]] = body["value"]
            return 201, body
        if path == "/api/v2/variables":
            pattern = query.get("variable_key_pattern", [""])[0]
            keys = [k for k in airflow.variables if pattern in k]  # insertion order: the ids' order
            return 200, {
                "variables": [{"key": k, "value": airflow.variables[k]} for k in reversed(keys)][:20]
            }
        if path.startswith("/api/v2/variables/"):
            key = path.removeprefix("/api/v2/variables/")
            if method == "DELETE":
                return (204, {}) if airflow.variables.pop(key, None) is not None else None
            return (200, {"key": key, "value": airflow.variables[key]}) if key in airflow.variables else None
        if path == RUNS and method == "POST":
            for run in airflow.runs:
                if run["dag_run_id"] == body["dag_run_id"] or (
                    body.get("logical_date") and run["logical_date"] == body["logical_date"]
                ):
                    return 409, {"detail": "Unique constraint violation"}
            airflow.add_run(body["dag_run_id"], "queued", body["conf"], logical_date=body.get("logical_date"))
            return 200, airflow.runs[-1]
        if path == RUNS:
            states = query.get("state")
            runs = [r for r in reversed(airflow.runs) if not states or r["state"] in states]
            gte, lte = query.get("logical_date_gte", [None])[0], query.get("logical_date_lte", [None])[0]
            if gte or lte:  # (ISO dates of one format compare as strings)
                runs = [
                    r for r in runs if r["logical_date"] and (gte or "") <= r["logical_date"] <= (lte or "~")
                ]
            if query.get("order_by") == ["-logical_date"]:
                runs.sort(key=lambda r: r["logical_date"] or "", reverse=True)
            offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
            return 200, {"dag_runs": runs[offset : offset + limit], "total_entries": len(runs)}
        if path == "/api/v2/eventLogs":
            logs = airflow.event_logs.get(query["run_id"][0], [])
            return 200, {"event_logs": logs, "total_entries": len(logs)}
        if path.startswith(RUNS + "/"):
            run_id, _, rest = path.removeprefix(RUNS + "/").partition("/")
            run = airflow.run(run_id)
            if run is None:
                return None
            if not rest and method == "PATCH":
                run.update(body)
                return 200, run
            if not rest:
                return 200, run
            if rest == "taskInstances":
                tis = airflow.tis.get(run_id, [])
                offset = int(query.get("offset", ["0"])[0])
                return 200, {"task_instances": tis[offset:], "total_entries": len(tis)}
            if rest.endswith("/logs/1"):
                task_id = rest.split("/")[1]
                ti = next((t for t in airflow.tis.get(run_id, []) if t["task_id"] == task_id), None)
                return (200, {"content": ti.get("log", []), "continuation_token": None}) if ti else None
        return None

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def log_message(self, *args: Any) -> None:
        pass
