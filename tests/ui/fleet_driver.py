"""The Sky page under a real Airflow, with clusters on three infras, watched in headless Chromium. Reports
what it saw.

Run by test_fleet_view_browser.py as `unshare --net -- python -m tests.ui.fleet_driver CONFIG REPORT` (a
private network namespace, as sweep_driver.py): it brings `lo` up and starts, in the namespace,

- an ssh node pool of real OpenSSH servers (tests/ssh/sshd.py) and the pool file naming it,
- moto in server mode for EC2, SSM and DynamoDB, with local play nodes standing in for its instances
  (tests/play_nodes.py: nothing connects to an address moto returns),
- `airflow standalone` with three password users: admin, a user (may edit DAG runs) and a viewer;

then, as admin, triggers three DAGs that each keep a cluster up (down=False): on local (whose rank 1 is
preempted mid-run and replaced), on the ssh pool, and on aws (spot). Then:

  1. the plugin's nav entry is registered and opens the page;
  2. reads the Sky page in Chromium as admin until every cluster shows, with its owner and events;
  3. as the viewer: the page shows the local cluster read-only, and the down API answers 403;
  4. as admin: clicks Down on the idle local cluster (confirming), and reads the page until it shows it
     torn down; reads the infra that it is gone;
  5. cleans up: downs the other clusters through the page's API, stops everything.

CONFIG: {"home", "timeout_s", "probe"}
REPORT: {"stage", "error"?, "runs", "plugin", "nav", "admin_view", "viewer_view", "viewer_down",
         "after_down", "local_clusters", "cleanup"}
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.scheduler.stack import stop_on_sigterm
from tests.scheduler.stack_driver import API, _get, _trigger, start_standalone, stop_stack
from tests.ui.progress_driver import PAGE_TIMEOUT_MS, Stage
from tests.ui.progress_page import chromium, log_in
from tests.ui.sweep_driver import _auth_env, _ended, _token

USERS = {"admin": "admin", "editor": "user", "viewer": "viewer"}  # user -> role
REGION = "us-east-1"
IMAGE_PARAMETER = "/test/airflow-sky/dlami"

DAGS = {
    "fleet_local": """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

with DAG("fleet_local", schedule=None) as dag:
    sky_job(
        Task(
            name="local-train",
            num_nodes=2,
            run='echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> {probe}/local; '
                'if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 600; fi',
        ),
        cluster_name="fleet-local", down=False, deferrable=True, defer_after_s=0,
    )
""",
    "fleet_ssh": """
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

with DAG("fleet_ssh", schedule=None) as dag:
    sky_job(
        Task(name="ssh-job", num_nodes=2, resources=Resources(infra="ssh/{pool}"), run="echo on the pool"),
        cluster_name="fleet-ssh", down=False,
    )
""",
    "fleet_aws": """
from airflow.sdk import DAG
from airflow_sky import Resources, Task, sky_job

with DAG("fleet_aws", schedule=None) as dag:
    sky_job(
        Task(
            name="aws-job",
            num_nodes=1,
            resources=Resources(
                infra="aws/{region}", instance_type="m6i.large", use_spot=True,
                image_id="resolve:ssm:{image}",
            ),
            run="echo on aws",
        ),
        cluster_name="fleet-aws", down=False,
    )
""",
}

READ_PAGE_JS = """
() => ({
  loaded: document.getElementById('sky-fleet').getAttribute('data-loaded'),
  status: (document.querySelector('[data-field="status"]') || {}).textContent,
  catalog: (document.querySelector('[data-field="catalog"]') || {}).textContent,
  clusters: [...document.querySelectorAll('tr.sky-cluster')].map(r => ({
    cluster: r.getAttribute('data-cluster'), infra: r.getAttribute('data-infra'),
    status: r.getAttribute('data-status'),
    cells: Object.fromEntries([...r.querySelectorAll('td[data-field]')].map(
      c => [c.getAttribute('data-field'), c.textContent])),
    events: [...r.querySelectorAll('details.sky-events li[data-kind]')].map(
      e => ({kind: e.getAttribute('data-kind'), rank: e.getAttribute('data-rank'), text: e.textContent})),
    actions: [...r.querySelectorAll('button.sky-action')].map(b => b.getAttribute('data-action')),
    readonly: !!r.querySelector('.sky-readonly'),
  })),
  jobs: [...document.querySelectorAll('tr.sky-fleet-job')].map(r => ({
    cluster: r.getAttribute('data-cluster'), job: r.getAttribute('data-job-id'),
    status: r.getAttribute('data-status')})),
})
"""


def _preempt_rank_1_once_running(probe: Path) -> bool:
    from airflow_sky.infra.local.cloud import LocalCloud

    lines = (probe / "local").read_text().splitlines() if (probe / "local").exists() else []
    if len(lines) >= 2:
        LocalCloud().preempt("fleet-local", 1)
        return True
    return False


def _stacks_of_tasks() -> list[str]:
    """py-spy's stacks of the Airflow task processes (a run that does not end: where it waits)."""
    pids = subprocess.run(["pgrep", "-f", "airflow"], capture_output=True, text=True).stdout.split()
    spy = str(Path(sys.executable).parent / "py-spy")
    dumps = []
    for pid in pids:
        out = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=60)
        if "fleet_local" in out.stdout or "follow" in out.stdout:
            dumps.append(out.stdout[-6000:])
    return dumps


def _down_url(cluster: str) -> str:
    return f"/airflow-sky/api/v1/fleet/clusters/{cluster}/down"


def run(config: dict[str, Any], report: dict[str, Any], stage: Stage, passwords: dict[str, str]) -> None:
    client = httpx.Client(base_url=API, timeout=60)
    token = stage.wait("the API server", lambda: _token(passwords["admin"], "admin"))
    client.headers["Authorization"] = f"Bearer {token}"
    for dag_id in DAGS:
        stage.wait(
            f"DAG {dag_id} parsed", lambda d=dag_id: _get(client, f"/api/v2/dags/{d}").status_code == 200
        )
    runs = {dag_id: _trigger(client, dag_id) for dag_id in DAGS}
    stage.wait(
        "rank 1 of the local job to be preempted", lambda: _preempt_rank_1_once_running(Path(config["probe"]))
    )
    deadline = time.monotonic() + 150
    while _ended(client, "fleet_local", runs["fleet_local"]) is None and time.monotonic() < deadline:
        time.sleep(2)
    if _ended(client, "fleet_local", runs["fleet_local"]) is None:
        report["stuck"] = _stacks_of_tasks()  # what the local job's tasks are doing, for the failure
    report["runs"] = {
        dag_id: stage.wait(f"{dag_id} to end", lambda d=dag_id, r=run_id: _ended(client, d, r))
        for dag_id, run_id in runs.items()
    }

    plugins = _get(client, "/api/v2/plugins").json()["plugins"]
    report["plugin"] = [
        view for p in plugins for view in p.get("external_views", []) if view.get("destination") == "nav"
    ]
    with chromium() as browser:
        admin = browser.new_context(viewport={"width": 1600, "height": 1200})
        admin.set_default_timeout(PAGE_TIMEOUT_MS)
        page = admin.new_page()
        stage.report["stage"] = "signing in as admin"
        log_in(page, API, "admin", passwords["admin"], PAGE_TIMEOUT_MS)

        # 1. The nav entry: Airflow's own page for the plugin's url_route shows the Sky page in its frame.
        stage.report["stage"] = "the nav entry's page"
        report["nav"] = None
        for _ in range(3):  # a page whose plugin list did not load shows "not found": load it again
            page.goto(f"{API}/plugin/sky_fleet")
            deadline = time.monotonic() + 30
            while report["nav"] is None and time.monotonic() < deadline:
                report["nav_frames"] = [f.url for f in page.frames]
                report["nav_iframes"] = page.evaluate(
                    "[...document.querySelectorAll('iframe')].map(f => [f.title, f.getAttribute('src')])"
                )
                report["nav"] = next((u for u in report["nav_frames"] if "/airflow-sky/fleet" in u), None)
                time.sleep(1.0)
            if report["nav"] is not None:
                break
            report.setdefault("nav_pages", []).append(page.content()[-3000:])

        # 2. The page itself, until each cluster shows with its events.
        page.goto(f"{API}/airflow-sky/fleet")

        def every_cluster() -> dict[str, Any] | None:
            view = page.evaluate(READ_PAGE_JS)
            names = {c["cluster"]: c for c in view["clusters"]}
            local = names.get("fleet-local")
            ready = (
                {"fleet-local", "fleet-ssh", "fleet-aws"} <= set(names)
                and local is not None
                and any(e["kind"] == "replaced" for e in local["events"])
            )
            return view if ready else None

        report["admin_view"] = stage.wait("the Sky page to show every cluster", every_cluster)

        # 3. The viewer: read-only, and the API refuses the down.
        viewer = browser.new_context(viewport={"width": 1600, "height": 1200})
        viewer.set_default_timeout(PAGE_TIMEOUT_MS)
        viewer_page = viewer.new_page()
        stage.report["stage"] = "signing in as the viewer"
        log_in(viewer_page, API, "viewer", passwords["viewer"], PAGE_TIMEOUT_MS)
        viewer_page.goto(f"{API}/airflow-sky/fleet")

        def viewer_read() -> dict[str, Any] | None:
            view: dict[str, Any] = viewer_page.evaluate(READ_PAGE_JS)
            return view if view["clusters"] else None

        report["viewer_view"] = stage.wait("the viewer's Sky page", viewer_read)
        down = httpx.post(
            f"{API}{_down_url('fleet-local')}",
            params={"infra": "local"},
            json={"confirm": True},
            headers={"Authorization": f"Bearer {_token(passwords['viewer'], 'viewer')}"},
            timeout=60,
        )
        report["viewer_down"] = {"status": down.status_code, "body": down.text[:500]}
        unconfirmed = client.post(_down_url("fleet-local"), params={"infra": "local"}, json={})
        report["unconfirmed_down"] = unconfirmed.status_code

        # 4. The admin downs the idle local cluster from the page.
        stage.report["stage"] = "downing the local cluster from the page"
        page.on("dialog", lambda dialog: dialog.accept())
        page.locator('tr.sky-cluster[data-cluster="fleet-local"] button[data-action="down"]').click()

        def torn_down() -> dict[str, Any] | None:
            view = page.evaluate(READ_PAGE_JS)
            row = next((c for c in view["clusters"] if c["cluster"] == "fleet-local"), None)
            return view if row is not None and row["status"] == "TERMINATED" else None

        report["after_down"] = stage.wait("the page to show the local cluster torn down", torn_down)
    from airflow_sky.infra.local.cloud import LocalCloud

    report["local_clusters"] = list(LocalCloud().clusters())

    # 5. The others go down through the page's API (as admin).
    report["cleanup"] = {
        name: client.post(_down_url(name), params={"infra": infra}, json={"confirm": True}).status_code
        for name, infra in (("fleet-ssh", f"ssh/{config['pool']}"), ("fleet-aws", f"aws/{REGION}"))
    }


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    home = Path(config["home"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    report: dict[str, Any] = {"stage": "starting the ssh hosts and moto"}
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    from airflow_sky.infra.aws.cloud import ENDPOINT_RESOLVER_ENV
    from airflow_sky.infra.home import KNOWN_HOSTS_ENV, SSH_CONFIG_ENV
    from airflow_sky.infra.ssh.pools import POOL_FILE_ENV
    from tests.aws.conftest import boto, moto_connection, moto_image
    from tests.play_nodes import play_cluster
    from tests.ports import free_port
    from tests.ssh.sshd import SshdPool

    pool = SshdPool(2, "fleet", 2)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := free_port()), verbose=False)
    stack = None
    try:
        pool.start()
        pool_file = pool.root / "ssh_node_pools.yaml"
        pool_file.write_text(pool.pool_yaml(config["pool"]))
        moto.start()
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION
        )
        boto("ssm", endpoint).put_parameter(
            Name=IMAGE_PARAMETER, Value=moto_image(endpoint), Type="String", Overwrite=True
        )
        with play_cluster(home.parent, "fleetplay", size=2) as play:
            os.environ.update(
                {
                    SSH_CONFIG_ENV: str(pool.ssh_config),
                    KNOWN_HOSTS_ENV: str(pool.known_hosts),
                    POOL_FILE_ENV: str(pool_file),
                    "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(moto_connection(endpoint, play["key"])),
                    ENDPOINT_RESOLVER_ENV: "tests.play_nodes:resolve",
                    "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                }
            )
            for dag_id, source in DAGS.items():
                text = source.format(
                    probe=config["probe"], pool=config["pool"], region=REGION, image=IMAGE_PARAMETER
                )
                (home / "dags" / f"{dag_id}.py").write_text(text)
            env, passwords = _auth_env(home, USERS)
            log = home / "standalone.log"
            stack = start_standalone(env, log)
            report["log"] = str(log)
            try:
                run(config, report, Stage(report, stack, float(config.get("timeout_s", 600))), passwords)
            except Exception as e:  # the report carries the failure to the test, with the stage it was at
                report["error"] = f"{type(e).__name__}: {e}"
            finally:
                stop_stack(stack)
                _down_leftovers(config, report)
    except Exception as e:
        report.setdefault("error", f"{type(e).__name__}: {e}")
    finally:
        moto.stop()
        report["leftover_processes"] = pool.leftover_processes()
        pool.stop()
        Path(report_path).write_text(json.dumps(report, indent=1, default=str))
    return 0


def _down_leftovers(config: dict[str, Any], report: dict[str, Any]) -> None:
    """Whatever a failed run left up (the clusters of the three infras), through the real CLI."""
    left = {}
    for name in ("fleet-local", "fleet-ssh", "fleet-aws"):
        done = subprocess.run(
            [sys.executable, "-m", "airflow_sky.client.cli", "down", "-y", name],
            capture_output=True,
            text=True,
            timeout=300,
        )
        left[name] = done.returncode
    report["leftovers_down"] = left


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main(sys.argv[1], sys.argv[2]))
