"""Managed jobs against a real Airflow (`airflow standalone`), driven through the `airflow-sky jobs` CLI.

Runs inside a private network namespace (see stack.py). The scenario, as a user would go through it:

0. the stack keeps Airflow's default `dags_are_paused_at_creation = True`, and the managed jobs DAG comes up
   unpaused all the same; paused by hand, `jobs launch` refuses in one line naming `airflow dags unpause`;
1. a bad task is refused by `jobs launch` locally: nothing reaches Airflow (no run, no Variable); two hostile
   confs posted straight to the REST API (the worker's own file as a file_mount; an infra the deployment
   does not allow) fail their spec task with the policy's line, no node started (checked at the end);
2. `jobs launch train.yaml --secret TOKEN` (the value from the environment) follows the job's logs; the CLI is
   killed once every rank runs; a worker node is then preempted; `jobs queue` shows RECOVERING, then
   SUCCEEDED with one recovery; `jobs logs` shows both generations of every rank; the job's ranks report
   progress, which `jobs queue` shows (the deployment's progress plugin) while it runs and after;
3. `jobs launch --detach` of a long job (with a local workdir), `jobs cancel` once it runs: CANCELLED, no
   node left, and its files gone from the jobs bucket;
4. a pipeline runs its tasks in order; one longer than the DAG's slots is refused locally;
5. `jobs launch` of a task with `workdir: .`, a local file and an s3:// file_mount: the CLI uploads the local
   files to the jobs bucket (moto's S3 server, started here, in the namespace), every rank prints all three,
   and the run's prefix is removed when it ends;
6. `jobs pool apply` of a 2-worker pool, `jobs launch --pool --num-jobs 3`: every job runs on a worker
   (SKYPILOT_JOB_RANK 0..2), never more than 2 at once, no setup per job; a job with a setup is refused
   locally; `jobs pool status` shows the workers idle after; `jobs pool down` ends them.

Writes a JSON report: the CLI outputs, the statuses `jobs queue` showed, the runs' confs and Variables, and
what the jobs bucket holds.
Usage: jobs_driver.py CONFIG.json REPORT.json; CONFIG: {"home", "probe", "timeout_s"}.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from airflow_sky.client.managed_ids import logical_date_of
from airflow_sky.infra.local import layout
from tests.s3server import S3Server
from tests.scheduler.stack_driver import (
    API,
    _exit_on_sigterm,
    _get,
    _request,
    _stack_env,
    _wait_for,
    stop_stack,
)

SKY = str(Path(sys.executable).parent / "airflow-sky")
SECRET = "managed-s3cr3t-value"
DAG_FILE = (
    "from airflow_sky.dags.managed import managed_jobs_dag\n\ndag = managed_jobs_dag(pipeline_slots=2)\n"
)
TRAIN = """name: train
num_nodes: 2
envs:
  PROBE: {probe}
secrets:
  TOKEN: null
setup: |
  # A replacement node's setup holds the job in RECOVERING until `jobs queue` was seen to say so (at most
  # 300 s): a fixed sleep of 8 s was shorter than one `jobs queue` call on a loaded CI machine.
  if [ -f "$PROBE/launched" ]; then
    for i in $(seq 1 600); do [ -f "$PROBE/recovering-seen" ] && break; sleep 0.5; done
  fi
run: |
  echo "rank $SKYPILOT_NODE_RANK gen $AIRFLOW_SKY_RECOVERY_COUNT token=$TOKEN"
  echo "$SKYPILOT_NODE_RANK $AIRFLOW_SKY_RECOVERY_COUNT" >> "$PROBE/starts"
  # Progress as a training loop reports it: step 3 of 10 until preempted, the last step once recovered
  # (braces doubled: the YAML is a format string).
  if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then
    echo '@@airflow-sky-progress/1 {{"step":3,"total":10,"metrics":{{"loss":0.5}}}}'
    sleep 600
  fi
  sleep 2
  echo '@@airflow-sky-progress/1 {{"step":10,"total":10,"metrics":{{"loss":0.25}}}}'
  echo "rank $SKYPILOT_NODE_RANK done"
"""
LONG = """name: long
num_nodes: 2
workdir: .
envs:
  PROBE: {probe}
run: |
  echo "$SKYPILOT_NODE_RANK" >> "$PROBE/long-starts"
  sleep 600
"""
BAD = "name: bad\nnum_nodes: two\nrun: echo never\n"
PIPELINE = """name: prep-train
---
name: prepare
run: echo prepared > "{probe}/prepared"
---
name: train
num_nodes: 2
run: test -f "{probe}/prepared" && echo "$SKYPILOT_NODE_RANK" >> "{probe}/trained"
"""
PIPELINE3 = PIPELINE + "---\nname: evaluate\nrun: echo eval\n"
# Run from a directory of its own: `workdir: .` is that directory; the settings file lies next to it.
FILES = """name: files
num_nodes: 2
workdir: .
file_mounts:
  ~/conf/settings.txt: ../settings.txt
  ~/inputs: s3://inputs/data
run: |
  echo "rank $SKYPILOT_NODE_RANK workdir: $(cat message.txt)"
  echo "rank $SKYPILOT_NODE_RANK file: $(cat ~/conf/settings.txt)"
  echo "rank $SKYPILOT_NODE_RANK bucket: $(cat ~/inputs/data.txt)"
  if [ -e debug.log ]; then echo "rank $SKYPILOT_NODE_RANK has debug.log"; fi
"""
JOBS_BUCKET, JOBS_PREFIX = "sky-jobs", "uploads"
WORKER_KEY = "WORKER-PRIVATE-KEY-MARKER"
# Run confs posted straight to the API (a user who may trigger the DAG): run id -> (conf's task extras, infra).
HOSTILE = {
    "sky-job-hostile-worker-path": ({"file_mounts": {"/tmp/k": "{probe}/worker-key"}}, "local"),
    "sky-job-hostile-infra": ({}, "aws/us-east-1"),
}


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # stdin is no terminal (a test run from one must not be asked to confirm).
    return subprocess.run(
        [SKY, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


def _queue(env: dict[str, str]) -> dict[str, str]:
    """job id -> status, as `airflow-sky jobs queue` prints them."""
    out = _cli(env, "jobs", "queue").stdout
    statuses = {}
    for line in out.splitlines():
        fields = line.split()
        # The integer id (the first field) and the run id (kept on 80 columns: the hostile runs have no id).
        for field in fields[:1] if fields and fields[0].isdigit() else []:
            statuses[field] = fields[-1]
        for field in fields:
            if field.startswith("sky-job-"):
                statuses[field] = fields[-1]
    return statuses


def _starts(probe: Path, name: str) -> list[str]:
    path = probe / name
    return path.read_text().splitlines() if path.exists() else []


def _until(what: str, check: Any, timeout_s: float, report: dict[str, Any], poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _run_id(client: httpx.Client, job_id: str) -> str:
    """The run id of managed job `job_id` (its run's logical date, as the CLI resolves it)."""
    when = logical_date_of(int(job_id))
    runs = _get(
        client,
        "/api/v2/dags/airflow_sky_jobs/dagRuns",
        params={"logical_date_gte": when, "logical_date_lte": when},
    ).json()["dag_runs"]
    return str(runs[0]["dag_run_id"])


def _uploaded(s3: S3Server, run_id: str) -> list[str]:
    """The jobs bucket's objects of run `run_id`."""
    return [k for k in s3.keys(JOBS_BUCKET) if k.startswith(f"{JOBS_PREFIX}/{run_id}/")]


def scenario(
    env: dict[str, str], probe: Path, client: httpx.Client, report: dict[str, Any], s3: S3Server
) -> None:
    from airflow_sky.infra.local import daemon
    from airflow_sky.infra.local.cloud import LocalCloud

    (probe / "bad.yaml").write_text(BAD)
    (probe / "train.yaml").write_text(TRAIN.format(probe=probe))
    (probe / "long").mkdir()
    (probe / "long" / "long.yaml").write_text(LONG.format(probe=probe))
    (probe / "pipeline.yaml").write_text(PIPELINE.format(probe=probe))
    (probe / "pipeline3.yaml").write_text(PIPELINE3.format(probe=probe))

    bad = _cli(env, "jobs", "launch", str(probe / "bad.yaml"))
    report["bad"] = {"rc": bad.returncode, "output": bad.stdout + bad.stderr}
    _paused_dag_refuses_launches(env, probe, client, report)
    report["runs_after_bad"] = _get(client, "/api/v2/dags/airflow_sky_jobs/dagRuns").json()["total_entries"]
    _post_hostile(client, probe)

    # 2. Launch and follow; kill the CLI once every rank runs; preempt rank 1.
    out_path = probe / "launch.out"
    with out_path.open("w") as out:
        launcher = subprocess.Popen(
            [SKY, "jobs", "launch", str(probe / "train.yaml"), "--secret", "TOKEN", "-c", "managed-train"],
            env={**env, "TOKEN": SECRET},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _until("both ranks of the first job to run", lambda: len(_starts(probe, "starts")) >= 2, 480, report)
    finally:
        report["launch_output"] = out_path.read_text()[-4000:]  # what the CLI said, also when it failed
    _until("the CLI to print a rank's line", lambda: "gen 0" in out_path.read_text(), 60, report)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    report["launch_output"] = out_path.read_text()
    job_id = next(
        line.split()[2] for line in report["launch_output"].splitlines() if line.startswith("Managed job")
    )
    report["train_id"] = job_id
    report["train_job"] = _run_id(client, job_id)  # the run id: what the tables show whole
    run = _get(client, f"/api/v2/dags/airflow_sky_jobs/dagRuns/{report['train_job']}").json()
    report["train_conf"] = run["conf"]
    # `jobs queue` shows the running job's step through the deployment's progress plugin (live).
    report["train_live_queue"] = ""

    def live_progress() -> bool:
        report["train_live_queue"] = _cli({**env, "COLUMNS": "200"}, "jobs", "queue").stdout
        return "3/10 30%" in report["train_live_queue"]

    with contextlib.suppress(RuntimeError):  # the test says what was shown
        _until("jobs queue to show the running job's progress", live_progress, 120, report, poll_s=2.0)
    (probe / "launched").write_text("")
    LocalCloud().preempt("managed-train", 1)
    seen: list[str] = []

    def ended() -> bool:
        status = _queue(env).get(job_id, "?")
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "RECOVERING":
            (probe / "recovering-seen").write_text("")  # the replacement's setup may go on
        return status in ("SUCCEEDED", "FAILED", "CANCELLED", "FAILED_SETUP")

    _until("the first job to end", ended, 420, report, poll_s=0.5)
    report["train_statuses"] = seen
    report["train_queue"] = _cli(env, "jobs", "queue").stdout  # not a terminal: 80 columns
    report["train_queue_wide"] = _cli({**env, "COLUMNS": "200"}, "jobs", "queue").stdout
    logs = _cli(env, "jobs", "logs", job_id, "--no-follow")
    report["train_logs"] = logs.stdout + logs.stderr
    report["train_starts"] = _starts(probe, "starts")
    report["variables"] = [v["key"] for v in _get(client, "/api/v2/variables").json()["variables"]]

    # 3. A second job, detached, cancelled once it runs.
    launched = _cli(
        env, "jobs", "launch", str(probe / "long" / "long.yaml"), "-c", "managed-long", "--detach"
    )
    report["long_launch"] = launched.stdout + launched.stderr
    long_id = next(line.split()[2] for line in launched.stdout.splitlines() if line.startswith("Managed job"))
    long_run = _run_id(client, long_id)
    long_uploaded = _uploaded(s3, long_run)
    _until(
        "both ranks of the second job to run", lambda: len(_starts(probe, "long-starts")) >= 2, 300, report
    )
    cancelled = _cli(env, "jobs", "cancel", long_id)
    report["cancel_output"] = cancelled.stdout + cancelled.stderr
    statuses: list[str] = []

    def cancel_done() -> bool:
        status = _queue(env).get(long_id, "?")
        if not statuses or statuses[-1] != status:
            statuses.append(status)
        return status == "CANCELLED" and not daemon.processes_with_marker("managed-long")

    _until("the second job to be cancelled and its nodes gone", cancel_done, 300, report)
    report["long_statuses"] = statuses
    report["long_nodes_left"] = len(daemon.processes_with_marker("managed-long"))
    report["long_uploaded"] = bool(long_uploaded)
    # The cancelled run's teardown removes its files too (remove_uploads, a teardown task).
    _until("the cancelled job's files to be removed", lambda: not _uploaded(s3, long_run), 180, report)
    # What its killed follow tasks wrote of the torn-down cluster after its teardown (state/progress) is
    # removed by the run's last teardown, remove_leftovers.
    leftovers = f"/api/v2/dags/airflow_sky_jobs/dagRuns/{long_run}/taskInstances/remove_leftovers"
    _until(
        "the cancelled run's remove_leftovers to end",
        lambda: _get(client, leftovers).json().get("state") in ("success", "failed"),
        240,
        report,
    )
    report["long_leftovers"] = _get(client, leftovers).json().get("state")
    report["long_folder_left"] = sorted(
        str(path.relative_to(layout.root()))
        for folder in layout.root().glob("*managed-long*")
        for path in folder.rglob("*")
    )

    # 4. A pipeline: its tasks in order in one run; one longer than the DAG's slots is refused locally.
    too_long = _cli(env, "jobs", "launch", str(probe / "pipeline3.yaml"), "--detach")
    report["pipeline3"] = {"rc": too_long.returncode, "output": too_long.stdout + too_long.stderr}
    launched = _cli(env, "jobs", "launch", str(probe / "pipeline.yaml"), "--detach")
    report["pipeline_launch"] = launched.stdout + launched.stderr
    pipeline_id = next(
        line.split()[2] for line in launched.stdout.splitlines() if line.startswith("Managed job")
    )
    report["pipeline_status"] = _until(
        "the pipeline to end",
        lambda: (s := _queue(env).get(pipeline_id)) in ("SUCCEEDED", "FAILED", "FAILED_SETUP") and s,
        300,
        report,
    )
    report["pipeline_trained"] = sorted(_starts(probe, "trained"))
    # 5. Local files through the jobs bucket, and a bucket file_mount, on every rank.
    code = probe / "code"
    code.mkdir()
    (code / "message.txt").write_text("hello from the workdir\n")
    (code / ".gitignore").write_text("*.log\n")
    (code / "debug.log").write_text("stays on this machine\n")
    (code / "files.yaml").write_text(FILES)
    (probe / "settings.txt").write_text("lr=0.1\n")
    s3.client.put_object(Bucket="inputs", Key="data/data.txt", Body=b"from the inputs bucket\n")
    files = _cli(env, "jobs", "launch", str(code / "files.yaml"), "-c", "managed-files", timeout=420)
    report["files"] = {"rc": files.returncode, "output": files.stdout + files.stderr}
    files_id = next(line.split()[2] for line in files.stdout.splitlines() if line.startswith("Managed job"))
    files_run = _run_id(client, files_id)
    report["files_conf"] = _get(client, f"/api/v2/dags/airflow_sky_jobs/dagRuns/{files_run}").json()["conf"]
    report["files_status"] = _queue(env).get(files_id)
    logs = _cli(env, "jobs", "logs", files_id, "--no-follow")
    report["files_logs"] = logs.stdout + logs.stderr
    _until("the files job's uploads to be removed", lambda: not _uploaded(s3, files_run), 180, report)
    report["files_left"] = _uploaded(s3, files_run)
    report["jobs_bucket_left"] = s3.keys(JOBS_BUCKET)
    _pool_jobs(env, probe, report)
    report["runs_total"] = _get(client, "/api/v2/dags/airflow_sky_jobs/dagRuns").json()["total_entries"]
    report["hostile"] = {run_id: _refusal(client, env, run_id, report) for run_id in HOSTILE}
    report["clusters_left"] = [
        c for c in LocalCloud().clusters() if c.startswith(("managed-", "airflow-sky-jobs"))
    ]


POOL_FILE = """pool:
  workers: 2
setup: echo "setup $(hostname)" >> {probe}/pool-setups
"""
POOL_JOB = """name: pooled
run: |
  echo "start $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $(date +%s.%N)" >> {probe}/pool-jobs
  sleep 4
  echo "end $SKYPILOT_JOB_RANK $SKYPILOT_NUM_JOBS $(date +%s.%N)" >> {probe}/pool-jobs
"""


def _pool_jobs(env: dict[str, str], probe: Path, report: dict[str, Any]) -> None:
    """6. A pool and three managed jobs on it."""
    (probe / "pool.yaml").write_text(POOL_FILE.format(probe=probe))
    (probe / "pool-job.yaml").write_text(POOL_JOB.format(probe=probe))
    (probe / "pool-job-setup.yaml").write_text(POOL_JOB.format(probe=probe) + "setup: echo no\n")
    applied = _cli(env, "jobs", "pool", "apply", "-p", "mpool", str(probe / "pool.yaml"), "-y", timeout=300)
    report["pool_apply"] = {"rc": applied.returncode, "output": applied.stdout + applied.stderr}
    refused = _cli(env, "jobs", "launch", "--pool", "mpool", str(probe / "pool-job-setup.yaml"))
    report["pool_refused"] = {"rc": refused.returncode, "output": refused.stdout + refused.stderr}
    launched = _cli(env, "jobs", "launch", "--pool", "mpool", "--num-jobs", "3", str(probe / "pool-job.yaml"))
    report["pool_launch"] = {"rc": launched.returncode, "output": launched.stdout + launched.stderr}
    ids = [line.split()[2] for line in launched.stdout.splitlines() if line.startswith("Managed job")]
    report["pool_statuses"] = _until(
        "the pool's jobs to end",
        lambda: (
            (q := _queue(env))
            and all(q.get(i) in ("SUCCEEDED", "FAILED", "CANCELLED") for i in ids)
            and [q[i] for i in ids]
        ),
        420,
        report,
    )
    report["pool_jobs"] = _starts(probe, "pool-jobs")
    report["pool_setups"] = _starts(probe, "pool-setups")
    report["pool_queue"] = _cli(env, "jobs", "queue").stdout
    status = _cli(env, "jobs", "pool", "status", "mpool")
    report["pool_status"] = status.stdout + status.stderr
    down = _cli(env, "jobs", "pool", "down", "mpool", "-y", timeout=300)
    report["pool_down"] = {"rc": down.returncode, "output": down.stdout + down.stderr}


def _paused_dag_refuses_launches(
    env: dict[str, str], probe: Path, client: httpx.Client, report: dict[str, Any]
) -> None:
    """The DAG came up unpaused on a stack that pauses new DAGs; paused by hand, `jobs launch` refuses, naming
    the command that unpauses it (then it is unpaused again for the rest of the scenario)."""
    dag = "/api/v2/dags/airflow_sky_jobs"
    report["paused_at_start"] = _get(client, dag).json()["is_paused"]
    (probe / "paused.yaml").write_text("name: paused\nrun: echo never\n")
    _request(client, "PATCH", dag, json={"is_paused": True}).raise_for_status()
    try:
        refused = _cli(env, "jobs", "launch", str(probe / "paused.yaml"), "--detach")
    finally:
        _request(client, "PATCH", dag, json={"is_paused": False}).raise_for_status()
    report["paused"] = {"rc": refused.returncode, "stdout": refused.stdout, "stderr": refused.stderr}


def _post_hostile(client: httpx.Client, probe: Path) -> None:
    """Trigger the hostile confs through the REST API, as the UI or any API user can."""
    (probe / "worker-key").write_text(WORKER_KEY + "\n")
    for run_id, (extras, infra) in HOSTILE.items():
        fields = json.loads(json.dumps(extras).replace("{probe}", str(probe)))
        task = {"name": "hostile", "run": f"cat /tmp/k; touch {probe}/hostile-ran", **fields}
        conf = {"task": task, "secrets": [], "infra": infra, "cluster_name": "managed-hostile"}
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        posted = _request(client, "POST", "/api/v2/dags/airflow_sky_jobs/dagRuns", json=body)
        posted.raise_for_status()


def _refusal(
    client: httpx.Client, env: dict[str, str], run_id: str, report: dict[str, Any]
) -> dict[str, Any]:
    """How a hostile run ended: its state, `jobs queue`'s status, its spec task's log, its provision's state."""
    runs = f"/api/v2/dags/airflow_sky_jobs/dagRuns/{run_id}"
    state = _until(
        f"{run_id} to end",
        lambda: (s := _get(client, runs).json()["state"]) in ("success", "failed") and s,
        120,
        report,
    )
    log = _get(client, f"{runs}/taskInstances/spec/logs/1", headers={"Accept": "application/json"}).text
    provision = _get(client, f"{runs}/taskInstances/job.provision").json().get("state")
    logs = _cli(env, "jobs", "logs", run_id, "--no-follow")  # what its user sees: the refusal, one line
    return {
        "state": state,
        "queue": _queue(env).get(run_id),
        "spec_log": log,
        "provision": provision,
        "cli_logs": logs.stdout + logs.stderr,
    }


def _where_runs_are(client: httpx.Client) -> Any:
    """Whether the DAG is paused, and each run's state and task states: what a failed scenario waited on."""
    try:
        runs = _get(client, "/api/v2/dags/airflow_sky_jobs/dagRuns").json()["dag_runs"]
        return {
            "paused": _get(client, "/api/v2/dags/airflow_sky_jobs").json().get("is_paused"),
            "runs": {
                run["dag_run_id"]: [
                    run["state"],
                    sorted(
                        f"{ti['task_id']}[{ti['map_index']}]={ti['state']}"
                        for ti in _get(
                            client, f"/api/v2/dags/airflow_sky_jobs/dagRuns/{run['dag_run_id']}/taskInstances"
                        ).json()["task_instances"]
                    ),
                ]
                for run in runs
            },
        }
    except Exception as e:  # (the stack may be what broke)
        return f"{type(e).__name__}: {e}"


def main(config_path: str, report_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    home, probe = Path(config["home"]), Path(config["probe"])
    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "dags" / "airflow_sky_jobs.py").write_text(DAG_FILE)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    log = home / "standalone.log"
    # The S3 API the jobs bucket lives on, in this namespace: the CLI, the workers and the nodes reach it.
    s3 = S3Server().__enter__()
    for bucket in (JOBS_BUCKET, "inputs"):
        s3.client.create_bucket(Bucket=bucket)
    env = _stack_env(home)
    env.update(
        {
            # Airflow's default (the suite's other stacks turn it off): the managed jobs DAG must come up
            # unpaused by itself.
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW_CONN_AWS_DEFAULT": s3.connection,
            "AIRFLOW_CONN_SKY_NODES_AWS": s3.connection,  # local nodes' bucket credentials (node.credentials)
            "AIRFLOW__SKY__JOBS_BUCKET": f"s3://{JOBS_BUCKET}/{JOBS_PREFIX}",
            # These jobs run on local nodes: the deployment opts in (the default refuses local in a conf).
            "AIRFLOW__SKY__MANAGED_INFRAS": "local",
            # The clusters the CLI names (`-c managed-train`), and the bucket a task mounts besides its uploads.
            "AIRFLOW__SKY__MANAGED_CLUSTER_NAMES": "managed-*",
            "AIRFLOW__SKY__MANAGED_BUCKETS": "s3://inputs",
            "AIRFLOW__SKY__MANAGED_POOLS": "mpool",
        }
    )
    with log.open("wb") as out:
        stack = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "standalone"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    report: dict[str, Any] = {"log": str(log)}
    started = time.monotonic()
    client = httpx.Client(base_url=API, timeout=30)
    try:
        token = _wait_for(
            "the API server", lambda: client.get("/auth/token").json()["access_token"], 240, stack, log
        )
        client.headers["Authorization"] = f"Bearer {token}"
        _wait_for(
            "the managed jobs DAG to be parsed",
            lambda: client.get("/api/v2/dags/airflow_sky_jobs").status_code == 200,
            240,
            stack,
            log,
        )
        report["startup_s"] = time.monotonic() - started
        # The progress plugin comes from the package's airflow.plugins entry point alone.
        report["plugins"] = [p["name"] for p in _get(client, "/api/v2/plugins").json()["plugins"]]
        report["plugin_import_errors"] = _get(client, "/api/v2/plugins/importErrors").json()["import_errors"]
        cli_env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_SKY_API")}
        cli_env.update({"AIRFLOW_SKY_API_URL": API, "AIRFLOW_HOME": str(home / "cli-home")})
        # The launching machine's side of the jobs bucket: its own setting and AWS credentials.
        cli_env.update(
            {
                "AIRFLOW_SKY_JOBS_BUCKET": f"s3://{JOBS_BUCKET}/{JOBS_PREFIX}",
                "AIRFLOW_SKY_JOBS_ENDPOINT_URL": s3.endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
        )
        scenario(cli_env, probe, client, report, s3)
    except Exception as e:  # the report carries the failure to the test, with the stack's log
        report["error"] = f"{type(e).__name__}: {e}"
        report["at_error"] = _where_runs_are(client)
    finally:
        report["run_s"] = time.monotonic() - started
        stop_stack(stack)
        s3.__exit__(None, None, None)
        Path(report_path).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main(sys.argv[1], sys.argv[2]))
