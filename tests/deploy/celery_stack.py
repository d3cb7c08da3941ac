"""A distributed Airflow in one private network namespace: PostgreSQL, Redis, CeleryExecutor on two workers.

Run by test_celery_deployment.py as `unshare --net -- python -m tests.deploy.celery_stack CONFIG REPORT`.
The namespace's only interface is `lo`, so nothing it starts is reachable from outside, nor clashes with
another test's ports. It starts, each a process of its own:

    postgres (Debian's package, as the postgres user)   the metadata database, and Celery's result backend
    redis-server (Debian's package)                     Celery's broker
    an ssh pool of real OpenSSH servers (tests/ssh/sshd.py), defined only by an Airflow connection
    airflow api-server, scheduler, dag-processor, triggerer
    two `airflow celery worker`s, each with its own HOME, TMPDIR and AIRFLOW_HOME, and its own queue

A cluster policy (airflow_local_settings.task_policy) sends consecutive phases of a job to alternate queues,
so provision, start, follow and teardown of one job run on different workers: a phase that read state from
a worker's own disk would fail. The task logs go to one shared folder (a shared volume in a real
deployment), which the API server reads.

The driver triggers every DAG of CONFIG["dags"] through the REST API (/api/v2, a bearer token), optionally
kills the ssh host that runs rank 1 of one DAG once its run follow tasks all deferred (having read, when
CONFIG["progress_live"] names that DAG, its job's progress through the plugin first), touches a file that a
job's ranks wait for once one of its follow tasks deferred (CONFIG["release_when_deferred"]), waits for the runs,
then reads back through the REST API what the test checks, takes the UI screenshots, and writes REPORT.
Everything it started is stopped before it exits, whatever happened.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet

from tests.scheduler.stack_driver import _get, _task_instances, _trigger
from tests.ssh.sshd import PORT, SshdPool

API = "http://127.0.0.1:8080"
AIRFLOW = str(Path(sys.executable).parent / "airflow")
PG_PORT = 5432
REDIS_PORT = 6379
WORKERS = {"worker-a": "sky-a", "worker-b": "sky-b"}
LOG_PHASES = ("setup_follow", "run_follow", "provision", "teardown")  # whose logs the report carries
# Consecutive phases on alternate workers (the cluster policy below).
PHASE_QUEUES = {
    "provision": "sky-a",
    "sync": "sky-b",
    "setup_follow": "sky-a",
    "launch": "sky-b",
    "run_follow": "sky-a",
    "collect": "sky-b",
    "teardown": "sky-b",
    "terminated": "sky-a",
}

LOCAL_SETTINGS = f'''"""Cluster policy of the test deployment: each phase of a job on the queue of one of two workers."""

PHASE_QUEUES = {PHASE_QUEUES!r}


def task_policy(task):
    task.queue = PHASE_QUEUES.get(task.task_id.rsplit(".", 1)[-1], "sky-a")
'''

HOSTNAME_HOOK = '''"""[core] hostname_callable of the test deployment: each worker names itself (one machine hosts both)."""

import os
import socket


def hostname():
    return os.environ.get("SKY_STACK_WORKER") or socket.getfqdn()
'''


class Processes:
    """Every process the driver starts, each in its own session, each logging to a file of its own."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as out:
            self.started[name] = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw
            )

    def check(self) -> None:
        for name, proc in self.started.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.log_dir / name}.log")

    def stop_all(self) -> None:
        for proc in reversed(self.started.values()):  # workers and Airflow before the services they use
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 45
        for proc in self.started.values():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in self.started.values():  # what a component forked into its session (task processes)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _wait(what: str, check: Any, timeout_s: float, procs: Processes) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check()
        try:
            value = check()
        except (httpx.HTTPError, OSError, subprocess.CalledProcessError):
            value = None
        if value:
            return value
        time.sleep(1)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def start_postgres(root: Path, procs: Processes) -> str:
    """A fresh PostgreSQL cluster owned by the postgres user; returns the SQLAlchemy URL of db `airflow`."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    assert bins, "PostgreSQL is not installed (bootstrap installs Debian's postgresql)"
    bin_dir = Path(bins[-1]).parent
    data = Path(
        tempfile.mkdtemp(prefix="sky-pg-")
    )  # outside the test's 0700 temp dir: postgres must enter it
    owner = pwd.getpwnam("postgres")
    os.chown(data, owner.pw_uid, owner.pw_gid)
    (root / "pg_data_dir").write_text(str(data))
    subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(bin_dir / "initdb"),
            "-D",
            str(data / "db"),
            "-U",
            "airflow",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    procs.start(
        "postgres",
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(bin_dir / "postgres"),
            "-D",
            str(data / "db"),
            "-k",
            str(data),
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            str(PG_PORT),
            "-c",
            "max_connections=300",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
        ],
    )
    createdb = [str(bin_dir.parent / "bin" / "createdb"), "-h", "127.0.0.1", "-p", str(PG_PORT)]
    _wait(
        "PostgreSQL",
        lambda: subprocess.run([*createdb, "-U", "airflow", "airflow"], check=True, capture_output=True),
        60,
        procs,
    )
    return f"postgresql+psycopg2://airflow@127.0.0.1:{PG_PORT}/airflow"


def pool_connection(pool: SshdPool) -> str:
    """The pool as an Airflow connection (JSON): hosts with their users, the private key, pinned host keys."""
    return json.dumps(
        {
            "conn_type": "sky_ssh_pool",
            "port": PORT,
            "extra": {
                "hosts": [{"ip": h.address, "user": h.user} for h in pool.hosts],
                "private_key": pool.client_key.read_text(),
                "known_hosts": pool.known_hosts.read_text(),
                "state": pool.state_connection_field(),
            },
        }
    )


def airflow_env(root: Path, db_url: str, pool: SshdPool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__", "PYTEST"))}
    pylib = root / "pylib"
    env.update(
        {
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + db_url.replace("+psycopg2", ""),
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(root / "task-logs"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{API}/execution/",
            # A loaded API server answers the Task SDK in more than Airflow's 5 s default; 5 timed-out retries
            # fail a task before it starts (no start date). docs/deploy.md says the same for deployments.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "sky_stack_hostname.hostname",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__API__PORT": "8080",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW_CONN_SKY_POOL": pool_connection(pool),
            # The local infra is one machine's: every worker shares its state root (a single-host deployment).
            "AIRFLOW_SKY_LOCAL_ROOT": str(root / "local-root"),
            # The watcher's default rounds (60 s; the idle floor is 2 rounds): a loaded CI machine has shown
            # 80 s between a job's provision and its run, with no job on the nodes to keep them up.
            "AIRFLOW_SKY_AUTOSTOP_CHECK_S": "60",
            "PYTHONPATH": os.pathsep.join([str(pylib), str(Path.cwd())]),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    return env


def worker_env(base: dict[str, str], root: Path, name: str) -> dict[str, str]:
    """A worker of its own: HOME, TMPDIR and AIRFLOW_HOME nobody else reads."""
    own = root / name
    for sub in ("home", "tmp", "airflow"):
        (own / sub).mkdir(parents=True, exist_ok=True)
    return {
        **base,
        "HOME": str(own / "home"),
        "TMPDIR": str(own / "tmp"),
        "AIRFLOW_HOME": str(own / "airflow"),
        "SKY_STACK_WORKER": name,
    }


def start_stack(root: Path, procs: Processes, pool: SshdPool) -> dict[str, str]:
    (root / "pylib").mkdir(exist_ok=True)
    (root / "pylib" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
    (root / "pylib" / "sky_stack_hostname.py").write_text(HOSTNAME_HOOK)
    (root / "task-logs").mkdir(exist_ok=True)
    db_url = start_postgres(root, procs)
    procs.start(
        "redis",
        [
            "redis-server",
            "--port",
            str(REDIS_PORT),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
    )
    env = airflow_env(root, db_url, pool)
    migrate = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if migrate.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed: {migrate.stdout[-2000:]}{migrate.stderr[-3000:]}")
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        procs.start(
            component, [AIRFLOW, *component.replace("api-server", "api-server --port 8080").split()], env
        )
    for name, queue in WORKERS.items():
        procs.start(
            name,
            [
                AIRFLOW,
                "celery",
                "worker",
                "--queues",
                queue,
                "--concurrency",
                "16",
                "--celery-hostname",
                f"{name}@%h",
                "--skip-serve-logs",
            ],
            worker_env(env, root, name),
            cwd=root / name,
        )
    return env


def _preempt(pool: SshdPool, preempt: dict[str, Any]) -> str | None:
    """Kill the host whose marker says it runs the configured rank; its address once done."""
    for host in pool.hosts:
        marker = host.home / preempt["marker"]
        with contextlib.suppress(OSError):
            if marker.read_text().strip() == str(preempt["rank"]):
                host.kill()
                return host.address
    return None


def _logs(client: httpx.Client, dag_id: str, run_id: str, ti: dict[str, Any]) -> str:
    url = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
    got = _get(client, url, params={"map_index": ti["map_index"]}, headers={"Accept": "application/json"})
    got.raise_for_status()
    return "\n".join(
        str(entry.get("event", "")) if isinstance(entry, dict) else str(entry)
        for entry in got.json()["content"]
    )


def _all_task_instances(client: httpx.Client, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """Every task instance of the run, page by page (the API serves at most 100 at a time)."""
    tis: list[dict[str, Any]] = []
    while True:
        page = _get(
            client,
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
            params={"limit": 100, "offset": len(tis)},
        ).json()
        tis.extend(page["task_instances"])
        if len(tis) >= page["total_entries"] or not page["task_instances"]:
            return tis


def _screenshot(url: str, out: Path, profile: Path) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "chromium is not installed"
    try:
        shot = _chromium_screenshot(chromium, url, out, profile)
    except subprocess.TimeoutExpired:
        return "chromium took over 300 s (a loaded machine): no screenshot"
    return (
        ""
        if shot.returncode == 0 and out.exists()
        else f"chromium exited {shot.returncode}: {shot.stderr[-500:]}"
    )


def _chromium_screenshot(
    chromium: str, url: str, out: Path, profile: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--window-size=1600,1000",
            "--virtual-time-budget=20000",
            f"--screenshot={out}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def run(config: dict[str, Any], report: dict[str, Any], procs: Processes, pool: SshdPool) -> None:
    root = Path(config["root"])
    started = time.monotonic()
    start_stack(root, procs, pool)
    client = httpx.Client(base_url=API, timeout=30)
    token = _wait("the API server", lambda: client.get("/auth/token").json()["access_token"], 300, procs)
    client.headers["Authorization"] = f"Bearer {token}"
    dags: list[str] = config["dags"]
    for dag_id in dags:
        _wait(
            f"DAG {dag_id} parsed",
            lambda d=dag_id: client.get(f"/api/v2/dags/{d}").status_code == 200,
            300,
            procs,
        )
    report["startup_s"] = time.monotonic() - started
    runs = {dag_id: _trigger(client, dag_id) for dag_id in dags}
    preempt = config.get("preempt")
    fail_task = config.get("fail_task")
    abandon = config.get("abandon")
    release = config.get("release_when_deferred")
    watched = [d for d in dags if not abandon or d != abandon["dag_id"]]
    states = dict.fromkeys(dags, "queued")
    run_started = time.monotonic()
    deadline = run_started + float(config.get("timeout_s", 600))
    while time.monotonic() < deadline and not all(states[d] in ("success", "failed") for d in watched):
        procs.check()
        for dag_id, run_id in runs.items():
            states[dag_id] = _get(client, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
        if (
            preempt
            and _follows_all(client, preempt["dag_id"], runs[preempt["dag_id"]], "deferred")
            and _live_progress_read(client, config, preempt["dag_id"], runs[preempt["dag_id"]], report)
        ):
            killed = _preempt(pool, preempt)
            if killed:
                report["preempted"] = {"address": killed, "at_s": time.monotonic() - run_started}
                preempt = None
        if release and _follows_any(client, release["dag_id"], runs[release["dag_id"]], "deferred"):
            Path(release["file"]).touch()  # the job's ranks wait for this file
            report["released_at_s"] = time.monotonic() - run_started
            release = None
        # As early as can be: before the follow task got going, so nothing of it can react (its siblings must).
        if (
            fail_task
            and _phase_all(client, fail_task["dag_id"], runs[fail_task["dag_id"]], "launch", "success")
            and _mark_failed(client, fail_task, runs[fail_task["dag_id"]])
        ):
            report["marked_failed_at_s"] = time.monotonic() - run_started
            fail_task = None
        time.sleep(1)
    report["run_s"] = time.monotonic() - run_started
    report["runs"] = {}
    for dag_id in watched:
        run_id = runs[dag_id]
        tis = _all_task_instances(client, dag_id, run_id)
        keys = ("task_id", "map_index", "rendered_map_index", "state", "try_number", "hostname", "queue")
        keys += ("start_date", "end_date")
        entry: dict[str, Any] = {
            "run_id": run_id,
            "state": states[dag_id],
            "task_instances": [{k: ti.get(k) for k in keys} for ti in tis],
            "logs": {},
        }
        for ti in tis:
            if ti["task_id"].rsplit(".", 1)[-1] in config.get("log_phases", LOG_PHASES):
                entry["logs"][f"{ti['task_id']}[{ti['map_index']}]"] = _logs(client, dag_id, run_id, ti)
        first_start = next(ti for ti in tis if ti["task_id"].endswith(".sync"))  # per node: has the node link
        detail = _get(
            client,
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{first_start['task_id']}/{first_start['map_index']}",
        ).json()
        entry["rendered_fields"] = detail.get("rendered_fields")
        links = _get(
            client,
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{first_start['task_id']}/links",
            params={"map_index": first_start["map_index"]},
        )
        entry["extra_links"] = links.json() if links.status_code == 200 else {"status": links.status_code}
        report["runs"][dag_id] = entry
    # The connection types the UI's connection form offers (the provider registers `sky_ssh_pool`).
    hook_meta = _get(client, "/ui/connections/hook_meta")
    report["connection_types"] = (
        [h.get("connection_type") for h in hook_meta.json()] if hook_meta.is_success else []
    )
    if config.get("progress_api"):
        dag_id = config["progress_api"]
        report["progress_api"] = _progress_api(client, dag_id, runs[dag_id])
    shots = config.get("screenshots")
    if shots:
        dag_id = shots["dag_id"]
        run_id = runs[dag_id]
        follow = f"{shots['group']}.run_follow"
        out = Path(shots["dir"])
        out.mkdir(parents=True, exist_ok=True)
        report["screenshots_dir"] = str(out)
        report["screenshots"] = {
            "grid": _screenshot(f"{API}/dags/{dag_id}/runs/{run_id}", out / "grid.png", root / "chromium"),
            "log": _screenshot(
                f"{API}/dags/{dag_id}/runs/{run_id}/tasks/{follow}/mapped/1",
                out / "rank-log.png",
                root / "chromium",
            ),
        }
    if abandon:
        report["abandoned"] = _abandon(client, abandon, runs[abandon["dag_id"]], procs)


def _progress_api(client: httpx.Client, dag_id: str, run_id: str) -> dict[str, Any]:
    """The airflow-sky plugin's JSON API for a run, through the API server: with the driver's bearer token,
    and with a forged one. (Not without any: this deployment runs all-admins, where Airflow's middleware
    gives every request that brings no token an admin's.)"""
    url = f"/airflow-sky/api/v1/progress/{dag_id}/{run_id}"
    answer = _get(client, url, params={"history": 0})
    forged = httpx.get(f"{API}{url}", headers={"Authorization": "Bearer forged"}, timeout=30)
    body = answer.json() if answer.is_success else answer.text[:500]
    return {"status": answer.status_code, "body": body, "forged_status": forged.status_code}


def _live_progress_read(
    client: httpx.Client, config: dict[str, Any], dag_id: str, run_id: str, report: dict[str, Any]
) -> bool:
    """Whether the plugin's answer about the running job of `dag_id` is in the report (true at once when
    CONFIG["progress_live"] does not name it): kept once it reads the job live with every rank's report, or
    after 30 tries (the test says what it got)."""
    if config.get("progress_live") != dag_id or "progress_live" in report:
        return True
    answer = _progress_api(client, dag_id, run_id)
    jobs = answer["body"]["jobs"] if answer["status"] == 200 else []
    tries = report["progress_live_tries"] = report.get("progress_live_tries", 0) + 1
    read_live = bool(jobs) and jobs[0]["source"] == "live" and jobs[0]["progress"]["reported_ranks"] == 3
    if read_live or tries >= 30:
        report["progress_live"] = answer
    return "progress_live" in report


def _phase_all(client: httpx.Client, dag_id: str, run_id: str, phase: str, state: str) -> bool:
    """Whether every task instance of the phase (e.g. run_follow) of the run is in `state`."""
    tis = _task_instances(client, dag_id, run_id)
    found = [ti["state"] for ti in tis if ti["task_id"].endswith(f".{phase}")]
    return bool(found) and all(s == state for s in found)


def _follows_any(client: httpx.Client, dag_id: str, run_id: str, state: str) -> bool:
    """Whether any run_follow task instance of the run is in `state`."""
    tis = _task_instances(client, dag_id, run_id)
    return any(ti["state"] == state for ti in tis if ti["task_id"].endswith(".run_follow"))


def _follows_all(client: httpx.Client, dag_id: str, run_id: str, state: str) -> bool:
    return _phase_all(client, dag_id, run_id, "run_follow", state)


def _mark_failed(client: httpx.Client, fail_task: dict[str, Any], run_id: str) -> bool:
    """What a user does in the UI: mark one task instance failed. False while it does not exist yet (the
    scheduler expands a mapped task once its upstream is done)."""
    url = f"/api/v2/dags/{fail_task['dag_id']}/dagRuns/{run_id}/taskInstances/{fail_task['task_id']}"
    marked = client.patch(f"{url}/{fail_task['map_index']}", json={"new_state": "failed"})
    if marked.status_code == 404:
        return False
    marked.raise_for_status()
    return True


def _abandon(client: httpx.Client, abandon: dict[str, Any], run_id: str, procs: Processes) -> dict[str, Any]:
    """Kill every Airflow process at once (a lost scheduler machine) while the job's ranks run."""
    _wait(
        f"{abandon['dag_id']}'s run follow tasks running",
        lambda: _follows_all(client, abandon["dag_id"], run_id, "running"),
        360,
        procs,
    )
    for name in ("scheduler", "triggerer", "dag-processor", "api-server", *WORKERS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(procs.started[name].pid, signal.SIGKILL)
    return {"run_id": run_id, "cluster": abandon["cluster"]}


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    root = Path(config["root"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    procs = Processes(root)
    report: dict[str, Any] = {"logs": str(root), "local_root": str(root / "local-root")}
    pool = SshdPool(int(config["pool_size"]), config.get("pool_prefix", "stack"), 3)
    try:
        pool.start()
        report["pool"] = [{"address": h.address, "user": h.user} for h in pool.hosts]
        run(config, report, procs, pool)
    except Exception as e:  # the report carries the failure to the test, with where the logs are
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        procs.stop_all()
        with contextlib.suppress(Exception):
            for host in pool.hosts:  # a killed host comes back for the checks (as test_ssh_jobs does)
                if host.proc is None or host.proc.poll() is not None:
                    host.start()
            report["leftover_processes"] = pool.leftover_processes()
            report["locked_hosts"] = pool.locked_hosts()
        pool.stop()
        data_dir = root / "pg_data_dir"
        if data_dir.exists():
            shutil.rmtree(data_dir.read_text(), ignore_errors=True)
        Path(report_path).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    from tests.scheduler.stack import stop_on_sigterm

    stop_on_sigterm()
    sys.exit(main(sys.argv[1], sys.argv[2]))
