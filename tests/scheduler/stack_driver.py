"""Run one DAG under a real Airflow (scheduler, dag-processor, triggerer, API server) and report what happened.

Runs inside a private network namespace (see test_real_scheduler.py): `airflow standalone` binds its API
server and log servers on every interface, and its only interface here is `lo`. The driver brings `lo` up,
starts the stack, triggers the DAG through the REST API, optionally preempts a local node once a probe
file says the job is running, waits for the run to end, and writes a JSON report:

    {"state": ..., "task_instances": [...], "seen_states": [[task_id, state], ...], "xcom": {...},
     "startup_s": ..., "run_s": ...}

Usage: stack_driver.py CONFIG.json REPORT.json
CONFIG: {"home", "dag_id", "xcom_task_id", "timeout_s",
         "preempt": {"cluster", "rank", "probe", "lines", "after_deferred": task_id | null} | null}
    or, for many runs at once: {"home", "batch": {dag_id: number of runs}, "timeout_s"}; the report then
    is {"runs": [{"dag_id", "run_id", "state", "task_instances": [...]}], "startup_s", "run_s"}.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

API = "http://127.0.0.1:8080"


def _stack_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{API}/execution/",
            # A loaded API server answers the Task SDK in more than Airflow's 5 s default; 5 timed-out retries
            # fail a task before it starts (no start date). docs/deploy.md says the same for deployments.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
            "AIRFLOW__API__PORT": "8080",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
        }
    )
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)
    # standalone starts its components as `airflow ...` from PATH: the one installed next to this Python.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _wait_for(what: str, check: Any, timeout_s: float, stack: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack.poll() is not None:
            raise RuntimeError(f"airflow standalone exited ({stack.returncode}) while waiting for {what}")
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(1)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}; see {log}")


def start_standalone(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`airflow standalone` in a session of its own (stop_stack stops all it started), logging to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "standalone"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _preempt_when_running(config: dict[str, Any]) -> bool:
    """Preempt the configured rank once the probe file has enough lines; True once done."""
    from airflow_sky.infra.local.cloud import LocalCloud

    probe = Path(config["probe"])
    if probe.exists() and len(probe.read_text().splitlines()) >= int(config["lines"]):
        LocalCloud().preempt(config["cluster"], int(config["rank"]))
        return True
    return False


def _all_deferred(tis: list[dict[str, Any]], task_id: str | None) -> bool:
    """True when every mapped instance of `task_id` waits in the triggerer (or no task_id is given)."""
    if task_id is None:
        return True
    states = [ti["state"] for ti in tis if ti["task_id"] == task_id]
    return bool(states) and all(state == "deferred" for state in states)


def _task_instances(client: httpx.Client, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    tis = _get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 200})
    keys = ("task_id", "map_index", "state", "start_date", "end_date", "try_number", "note")
    return [{k: ti.get(k) for k in keys} for ti in tis.json()["task_instances"]]


def _get(client: httpx.Client, url: str, **kwargs: Any) -> httpx.Response:
    """A GET that rides out an API server too busy to answer in time (ten runs on two cores)."""
    return _request(client, "GET", url, **kwargs)


def _request(client: httpx.Client, method: str, url: str, **kwargs: Any) -> httpx.Response:
    for attempt in range(10):
        try:
            return client.request(method, url, **kwargs)
        except httpx.TimeoutException:
            if attempt == 9:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def _trigger(client: httpx.Client, dag_id: str) -> str:
    """Trigger a run with an id of our own. The stack's SQLite can answer 500 when another writer holds it
    (the API server writes its audit log after the run): try again, and a 409 then means the run is there."""
    run_id = f"manual__batch_{uuid.uuid4().hex[:12]}"
    for attempt in range(6):
        triggered = _request(
            client,
            "POST",
            f"/api/v2/dags/{dag_id}/dagRuns",
            json={"logical_date": None, "dag_run_id": run_id},
        )
        if triggered.status_code < 500 and not (attempt and triggered.status_code == 409):
            triggered.raise_for_status()
            return str(triggered.json()["dag_run_id"])
        if triggered.status_code == 409:
            return run_id
        time.sleep(1 + attempt)
    triggered.raise_for_status()
    raise AssertionError("unreachable")


def _run_batch(
    client: httpx.Client, config: dict[str, Any], stack: subprocess.Popen[bytes], log: Path, started: float
) -> dict[str, Any]:
    """Trigger every run of every DAG at once and wait for all of them to end."""
    batch: dict[str, int] = config["batch"]
    for dag_id in batch:
        _wait_for(
            f"DAG {dag_id} to be parsed",
            lambda d=dag_id: _get(client, f"/api/v2/dags/{d}").status_code == 200,
            240,
            stack,
            log,
        )
    startup_s = time.monotonic() - started
    runs = []
    for dag_id, count in batch.items():
        for _ in range(count):
            runs.append({"dag_id": dag_id, "run_id": _trigger(client, dag_id), "state": "queued"})
    run_started = time.monotonic()
    deadline = run_started + float(config.get("timeout_s", 900))
    while time.monotonic() < deadline:
        for run in runs:
            if run["state"] not in ("success", "failed"):
                run["state"] = _get(client, f"/api/v2/dags/{run['dag_id']}/dagRuns/{run['run_id']}").json()[
                    "state"
                ]
        if all(run["state"] in ("success", "failed") for run in runs):
            break
        time.sleep(5)
    for run in runs:
        run["task_instances"] = _task_instances(client, run["dag_id"], run["run_id"])
    return {"runs": runs, "startup_s": startup_s, "run_s": time.monotonic() - run_started}


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    home = Path(config["home"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    log = home / "standalone.log"
    started = time.monotonic()
    stack = start_standalone(_stack_env(home), log)
    report: dict[str, Any] = {"log": str(log)}
    try:
        client = httpx.Client(base_url=API, timeout=30)
        token = _wait_for(
            "the API server", lambda: client.get("/auth/token").json()["access_token"], 240, stack, log
        )
        client.headers["Authorization"] = f"Bearer {token}"
        if "batch" in config:
            report.update(_run_batch(client, config, stack, log, started))
            return 0
        dag_id = config["dag_id"]
        _wait_for(
            f"DAG {dag_id} to be parsed",
            lambda: client.get(f"/api/v2/dags/{dag_id}").status_code == 200,
            240,
            stack,
            log,
        )
        report["startup_s"] = time.monotonic() - started
        run_id = _trigger(client, dag_id)
        run_started = time.monotonic()
        preempt = config.get("preempt")
        deadline = run_started + float(config.get("timeout_s", 420))
        state = "queued"
        seen_states: set[tuple[str, str]] = set()  # (task_id, state) sampled while the run went on
        while time.monotonic() < deadline:
            state = _get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
            if state in ("success", "failed"):
                break
            sample = _get(
                client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100}
            )
            tis = sample.json()["task_instances"]
            seen_states.update((ti["task_id"], str(ti["state"])) for ti in tis)
            if (
                preempt
                and _all_deferred(tis, preempt.get("after_deferred"))
                and _preempt_when_running(preempt)
            ):
                report["preempted_at_s"] = time.monotonic() - run_started
                preempt = None
            time.sleep(0.5)
        report["state"] = state
        report["seen_states"] = sorted(seen_states)
        report["run_s"] = time.monotonic() - run_started
        tis = _get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        report["task_instances"] = [
            {k: ti.get(k) for k in ("task_id", "map_index", "state", "start_date", "end_date", "try_number")}
            for ti in tis.json()["task_instances"]
        ]
        xcom_task = config.get("xcom_task_id")
        if xcom_task:
            entry = _get(
                client,
                f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{xcom_task}/xcomEntries/return_value",
            )
            report["xcom"] = entry.json().get("value") if entry.status_code == 200 else None
    except Exception as e:  # the report carries the failure to the test, with the stack's log
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        stop_stack(stack)
        Path(report_path).write_text(json.dumps(report, indent=2))
    return 0


def stop_stack(stack: subprocess.Popen[bytes]) -> None:
    """Stop `airflow standalone` and every component it started (its own session)."""
    os.killpg(stack.pid, signal.SIGTERM)
    try:
        stack.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(stack.pid, signal.SIGKILL)
        stack.wait()
    # A component still running once standalone ended (a scheduler that did not stop on SIGTERM was found
    # an hour later, polling its database) is given a few seconds more, then killed.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(stack.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(stack.pid, signal.SIGKILL)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """A test that timed out sends SIGTERM: exit through `finally`, which stops the Airflow stack."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main(sys.argv[1], sys.argv[2]))
