"""A minGPT learning-rate sweep on a pool under a real Airflow, watched in headless Chromium; then a second
run of the sweep cancelled from the progress view's API. Reports what happened.

Run by test_sweep_view_browser.py as `unshare --net -- python -m tests.ui.sweep_driver CONFIG REPORT` (a
private network namespace, as stack_driver.py): it brings `lo` up, applies the pool with the real CLI (its
nodes live in this namespace), starts `airflow standalone` with two password users (admin, and a viewer
who may only read), and:

  1. triggers the sweep DAG; reads the progress view's sweep table in Chromium every second until the run
     ends (each read: every trial's state and step, the best trial, the total line);
  2. waits for the eval DAG, scheduled on the checkpoint asset by partition, to have run once per trial;
  3. triggers the sweep again; once two trials run, asks the cancel as the viewer (refused) and as admin;
     waits for the run to end and reads the pool's workers (idle, up).

CONFIG: {"home", "pool", "pool_file", "dag_id", "eval_dag_id", "trials", "hold", "timeout_s"}
REPORT: {"stage", "error"?, "apply", "reads": [...], "first": {"state", "task_instances", "results"},
         "eval_runs": [...], "cancel": {"viewer", "admin", "state", "trials", "workers"}}
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.scheduler.stack import stop_on_sigterm
from tests.scheduler.stack_driver import (
    API,
    _get,
    _stack_env,
    _task_instances,
    _trigger,
    start_standalone,
    stop_stack,
)
from tests.ui.progress_driver import PAGE_TIMEOUT_MS, Stage
from tests.ui.progress_page import chromium, log_in

USERS = {"admin": "admin", "viewer": "viewer"}  # user -> role

READ_SWEEP_JS = """
() => [...document.querySelectorAll('section.sky-sweep')].map(s => ({
  sweep: s.getAttribute('data-sweep'),
  total: (s.querySelector('[data-field="sweep-total"]') || {}).textContent || null,
  best: (s.querySelector('p.sky-best') || {}).textContent || null,
  lines: s.querySelectorAll('svg.sky-chart polyline').length,
  cancel: !!s.querySelector('button.sky-cancel'),
  trials: [...s.querySelectorAll('tr.sky-trial')].map(r => ({
    trial: Number(r.getAttribute('data-trial')), state: r.getAttribute('data-state'),
    best: r.classList.contains('best'), cells: [...r.children].map(c => c.textContent)})),
}))
"""


def _auth_env(home: Path, users: dict[str, str] = USERS) -> tuple[dict[str, str], dict[str, str]]:
    """The stack's env with password users (user -> role) and their passwords."""
    passwords = {user: secrets.token_urlsafe(12) for user in users}
    path = home / "simple_auth_manager_passwords.json"
    path.write_text(json.dumps(passwords))
    env = _stack_env(home)
    env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(path),
        }
    )
    return env, passwords


def _token(password: str, user: str) -> str | None:
    got = httpx.post(f"{API}/auth/token", json={"username": user, "password": password}, timeout=30)
    return str(got.json()["access_token"]) if got.status_code == 201 else None


def _ended(client: httpx.Client, dag_id: str, run_id: str) -> str | None:
    state = str(_get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"])
    return state if state in ("success", "failed") else None


def _sweep_api(client: httpx.Client, dag_id: str, run_id: str) -> dict[str, Any]:
    url = f"/airflow-sky/api/v1/progress/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"
    sweeps = _get(client, url, params={"history": 0}).json().get("sweeps") or [{}]
    return dict(sweeps[0])


def _workers(pool: str) -> list[dict[str, Any]]:
    from airflow_sky.client import pools

    return [{"cluster": w.cluster, "status": w.status, "job": w.job} for w in pools.status(pool).workers]


def run(config: dict[str, Any], report: dict[str, Any], stage: Stage, passwords: dict[str, str]) -> None:
    dag_id, trials = config["dag_id"], int(config["trials"])
    client = httpx.Client(base_url=API, timeout=30)
    token = stage.wait("the API server", lambda: _token(passwords["admin"], "admin"))
    client.headers["Authorization"] = f"Bearer {token}"
    for dag in (dag_id, config["eval_dag_id"]):
        stage.wait(
            f"DAG {dag} to be parsed", lambda d=dag: _get(client, f"/api/v2/dags/{d}").status_code == 200
        )
    run_id = _trigger(client, dag_id)
    report["reads"] = []
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1200})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        page = context.new_page()
        stage.report["stage"] = "signing in"
        log_in(page, API, "admin", passwords["admin"], PAGE_TIMEOUT_MS)
        page.goto(f"{API}/airflow-sky/progress/{quote(dag_id, safe='')}/{quote(run_id, safe='')}")
        deadline = time.monotonic() + float(config["timeout_s"])
        stage.report["stage"] = "watching the sweep"
        while time.monotonic() < deadline:
            report["reads"].append({"at": time.time(), "view": page.evaluate(READ_SWEEP_JS)})
            if _ended(client, dag_id, run_id):
                break
            time.sleep(1.0)
        report["first"] = {
            "state": stage.wait("the first run to end", lambda: _ended(client, dag_id, run_id))
        }

        def final_view() -> Any:
            view = page.evaluate(READ_SWEEP_JS)
            done = view and all(t["state"] in ("SUCCEEDED", "FAILED") for t in view[0]["trials"])
            return view if done else None

        report["first"]["view"] = stage.wait("the page after the run", final_view)
    report["first"]["task_instances"] = _task_instances(client, dag_id, run_id)
    picked = _get(
        client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/pick/xcomEntries/return_value"
    )
    report["first"]["picked"] = picked.json().get("value") if picked.status_code == 200 else None
    results_task = next(
        t["task_id"] for t in report["first"]["task_instances"] if t["task_id"].endswith(".results")
    )
    results = _get(
        client,
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{results_task}/xcomEntries/return_value",
    )
    report["first"]["results"] = results.json().get("value") if results.status_code == 200 else None

    def eval_runs() -> list[dict[str, Any]] | None:
        runs = _get(client, f"/api/v2/dags/{config['eval_dag_id']}/dagRuns").json()["dag_runs"]
        done = [r for r in runs if r["state"] in ("success", "failed")]
        return runs if len(done) >= trials else None

    report["eval_runs"] = stage.wait("the eval DAG to run once per trial", eval_runs)

    # The second run, cancelled once two trials run (its trials hold until then: config["hold"]).
    Path(config["hold"]).touch()
    run_id = _trigger(client, dag_id)

    def two_running() -> dict[str, Any] | None:
        sweep = _sweep_api(client, dag_id, run_id)
        return sweep if sum(1 for t in sweep.get("trials", []) if t["state"] == "RUNNING") >= 2 else None

    running = stage.wait("two trials to run", two_running)
    cancel_url = f"/airflow-sky/api/v1/sweeps/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/{running['sweep']}/cancel"
    viewer = httpx.post(
        API + cancel_url,
        json={"confirm": True},
        headers={"Authorization": f"Bearer {_token(passwords['viewer'], 'viewer')}"},
        timeout=30,
    )
    admin = client.post(cancel_url, json={"confirm": True})
    report["cancel"] = {"viewer": viewer.status_code, "admin": admin.status_code, "answer": admin.json()}
    report["cancel"]["state"] = stage.wait("the cancelled run to end", lambda: _ended(client, dag_id, run_id))

    def all_over() -> list[dict[str, Any]] | None:
        sweep = _sweep_api(client, dag_id, run_id)
        return sweep.get("trials") if sweep.get("finished") == trials else None

    report["cancel"]["trials"] = stage.wait("every trial to be over", all_over)
    report["cancel"]["task_instances"] = _task_instances(client, dag_id, run_id)
    report["cancel"]["workers"] = _workers(config["pool"])


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    home = Path(config["home"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    report: dict[str, Any] = {"stage": "applying the pool"}
    apply = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_sky.client.cli",
            "jobs",
            "pool",
            "apply",
            "-p",
            config["pool"],
            config["pool_file"],
            "-y",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report["apply"] = {"rc": apply.returncode, "out": apply.stdout[-3000:] + apply.stderr[-3000:]}
    if apply.returncode != 0:
        Path(report_path).write_text(json.dumps(report, indent=1))
        return 0
    env, passwords = _auth_env(home)
    log = home / "standalone.log"
    stack = start_standalone(env, log)
    report["log"] = str(log)
    try:
        run(config, report, Stage(report, stack, float(config.get("timeout_s", 600))), passwords)
    except Exception as e:  # the report carries the failure to the test, with the stage it was at
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        stop_stack(stack)
        down = subprocess.run(
            [sys.executable, "-m", "airflow_sky.client.cli", "jobs", "pool", "down", config["pool"], "-y"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        report["down"] = {"rc": down.returncode, "out": down.stdout[-2000:] + down.stderr[-2000:]}
        Path(report_path).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main(sys.argv[1], sys.argv[2]))
