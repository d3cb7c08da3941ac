"""Watch a training job's progress view in a real browser under a real Airflow, and report what it showed.

Run by test_progress_view_browser.py as `unshare --net -- python -m tests.ui.progress_driver CONFIG REPORT`
(a private network namespace, as tests/scheduler/stack_driver.py). It starts `airflow standalone` with the
simple auth manager asking a password (not all-admins: Airflow would then authenticate every request, and
nothing could be refused), triggers the DAG, and meanwhile:

  1. asks the plugin's JSON API for the run without credentials (refused) and with a bearer token (200);
  2. signs in with headless Chromium on the auth manager's login page and opens the progress view;
  3. reads each rank's step and loss from the page until every rank advanced `reads` times;
  4. preempts the configured rank's node once a snapshot exists (LocalCloud().preempt), then reads the page
     until it shows the recovery and every rank advancing again; optionally screenshots it there;
  5. opens the DAG run page of the Airflow UI and follows the plugin's external view entry;
  6. waits for the run to end and asks the JSON API once more.

CONFIG: {"home", "dag_id", "cluster", "preempt_rank", "reads", "timeout_s", "screenshot": path | null}
REPORT: {"stage", "error"?, "api": {...}, "reads": {"before": {rank: [[step, loss]]}, "after": {...}},
         "views": {"before", "recovered", "final"}, "external_view": {...}, "state", "task_instances"}
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote

import httpx
from playwright.sync_api import Browser, Page

from tests.scheduler.stack import stop_on_sigterm
from tests.scheduler.stack_driver import (
    API,
    _get,
    _stack_env,
    _task_instances,
    _trigger,
    _wait_for,
    start_standalone,
    stop_stack,
)
from tests.ui.progress_page import Advance, chromium, job_of, log_in, rank_steps, read_view

USER = "admin"
PAGE_TIMEOUT_MS = 120_000  # a page load or click on a loaded machine
T = TypeVar("T")


class Stage:
    """Where the driver is (the report names it when something fails) and the stack it watches."""

    def __init__(self, report: dict[str, Any], stack: subprocess.Popen[bytes], timeout_s: float) -> None:
        self.report, self.stack, self.timeout_s = report, stack, timeout_s

    def wait(self, what: str, check: Callable[[], T | None]) -> T:
        """Wait for `check()` to return something truthy (read every second), up to timeout_s."""
        self.report["stage"] = what
        return cast(T, _wait_for(what, check, self.timeout_s, self.stack, Path(self.report["log"])))


def _auth_env(home: Path) -> tuple[dict[str, str], str]:
    """The stack's environment with one password user (admin) instead of all-admins; and the password."""
    password = secrets.token_urlsafe(12)
    passwords = home / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({USER: password}))
    env = _stack_env(home)
    env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        }
    )
    return env, password


def _token(client: httpx.Client, password: str) -> str | None:
    got = client.post("/auth/token", json={"username": USER, "password": password})
    return str(got.json()["access_token"]) if got.status_code == 201 else None


def _api_url(dag_id: str, run_id: str) -> str:
    return f"/airflow-sky/api/v1/progress/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def _api_answers(client: httpx.Client, dag_id: str, run_id: str) -> dict[str, Any]:
    """The plugin's JSON API for the run: without credentials, with a forged token, and with the token."""
    url = _api_url(dag_id, run_id)
    anonymous = httpx.get(f"{API}{url}", timeout=30)
    forged = httpx.get(f"{API}{url}", headers={"Authorization": "Bearer not-a-token"}, timeout=30)
    answer = _get(client, url, params={"history": 0})
    body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else None
    return {
        "anonymous_status": anonymous.status_code,
        "forged_status": forged.status_code,
        "status": answer.status_code,
        "body": body,
        "unknown_run_status": _get(client, _api_url(dag_id, "no-such-run")).status_code,
    }


def _snapshot_saved(cluster: str) -> bool:
    """Rank 0 saved a training snapshot on its node: a relaunch resumes from it, not from step 0."""
    from airflow_sky.infra.local import layout

    return any(layout.instances_dir(cluster).glob("*/home/sky_workdir/gpt_snapshot.pt"))


def _watch(
    stage: Stage, page: Page, config: dict[str, Any], report: dict[str, Any], api: Callable[[], Any]
) -> None:
    """Steps 3 and 4: read the ranks advancing, preempt, read the recovery and the ranks advancing again;
    `api()` (the JSON API's answer) is kept beside what the page showed at each of these moments."""
    cluster, ranks, reads = config["cluster"], int(config["num_nodes"]), int(config["reads"])

    def advanced(advance: Advance, extra: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        view = read_view(page)
        job = job_of(view, cluster)
        if job is None:
            return None
        advance.add(rank_steps(job))
        return view if advance.done() and extra(job) else None

    before = Advance(ranks, reads, {})
    report["reads"] = {"before": before.seen}
    report["views"] = {
        "before": stage.wait(
            "every rank advancing on the page, and a snapshot saved",
            lambda: advanced(before, lambda job: _snapshot_saved(cluster)),
        )
    }
    report["api"]["before"] = api()
    from airflow_sky.infra.local.cloud import LocalCloud

    LocalCloud().preempt(cluster, int(config["preempt_rank"]))
    report["preempted_at"] = time.time()

    def recovery_shown() -> dict[str, Any] | None:
        job = job_of(read_view(page), cluster)
        if job is None or job["fields"]["generation"] != "1":
            return None
        return job if any(r["generation"] == "1" for r in job["recoveries"]) else None

    shown = stage.wait("the recovery of generation 1 on the page", recovery_shown)
    after = Advance(ranks, reads, rank_steps(shown))
    report["reads"]["after"] = after.seen
    report["views"]["recovered"] = stage.wait(
        "every rank advancing again after the recovery", lambda: advanced(after, lambda job: True)
    )
    report["api"]["recovered"] = api()
    if config.get("screenshot"):
        page.locator("[data-refreshes]").screenshot(path=config["screenshot"])  # the view's root element
        report["screenshot"] = config["screenshot"]


def _external_view(
    stage: Stage, browser: Browser, client: httpx.Client, dag_id: str, run_id: str
) -> dict[str, Any]:
    """Step 5: the DAG run page offers the plugin's external view; following it shows the progress view."""
    plugins = _get(client, "/api/v2/plugins").json()["plugins"]
    views = [
        view
        for plugin in plugins
        for view in plugin.get("external_views", [])
        if view.get("destination") == "dag_run" and "/airflow-sky/progress/" in view.get("href", "")
    ]
    found: dict[str, Any] = {"registered": views}
    if not views:
        return found
    stage.report["stage"] = "the external view on the DAG run page"
    page = browser.contexts[0].new_page()
    page.goto(f"{API}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}", timeout=PAGE_TIMEOUT_MS)
    entry = page.get_by_text(views[0]["name"], exact=True).first
    entry.wait_for(timeout=PAGE_TIMEOUT_MS)
    found["entry"] = entry.evaluate("(el) => el.outerHTML.slice(0, 500)")
    entry.click(timeout=PAGE_TIMEOUT_MS)

    def view_url() -> str | None:
        return next(
            (f.url for p in page.context.pages for f in p.frames if "/airflow-sky/progress/" in f.url), None
        )

    found["opened"] = stage.wait("the external view opened from the DAG run page", view_url)
    page.close()
    return found


def run(config: dict[str, Any], report: dict[str, Any], stage: Stage, password: str) -> None:
    dag_id = config["dag_id"]
    client = httpx.Client(base_url=API, timeout=30)
    token = stage.wait("the API server", lambda: _token(client, password))
    client.headers["Authorization"] = f"Bearer {token}"
    stage.wait(
        f"DAG {dag_id} to be parsed", lambda: _get(client, f"/api/v2/dags/{dag_id}").status_code == 200
    )
    run_id = _trigger(client, dag_id)
    report["run_id"] = run_id
    report["api"] = {"running": _api_answers(client, dag_id, run_id)}
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(PAGE_TIMEOUT_MS)  # every load, click and wait of its pages
        page = context.new_page()
        stage.report["stage"] = "signing in"
        log_in(page, API, USER, password, PAGE_TIMEOUT_MS)
        page.goto(f"{API}/airflow-sky/progress/{quote(dag_id, safe='')}/{quote(run_id, safe='')}")
        api_url = _api_url(dag_id, run_id)
        _watch(stage, page, config, report, lambda: _get(client, api_url, params={"history": 0}).json())
        report["external_view"] = _external_view(stage, browser, client, dag_id, run_id)

        def ended() -> str | None:
            state = str(_get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"])
            return state if state in ("success", "failed") else None

        def final_view() -> dict[str, Any] | None:
            view = read_view(page)
            return view if job_of(view, config["cluster"]) else None

        report["state"] = stage.wait("the run to end", ended)
        report["views"]["final"] = stage.wait("the page after the run", final_view)
    report["api"]["ended"] = _api_answers(client, dag_id, run_id)
    report["task_instances"] = _task_instances(client, dag_id, run_id)


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    home = Path(config["home"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env, password = _auth_env(home)
    log = home / "standalone.log"
    stack = start_standalone(env, log)
    report: dict[str, Any] = {"log": str(log), "stage": "starting"}
    try:
        run(config, report, Stage(report, stack, float(config.get("timeout_s", 600))), password)
    except Exception as e:  # the report carries the failure to the test, with the stage it was at
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        stop_stack(stack)
        Path(report_path).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main(sys.argv[1], sys.argv[2]))
