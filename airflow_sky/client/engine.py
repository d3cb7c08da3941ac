"""Run one job as a DAG in this process (`airflow dags test` style): the engine behind the CLI and the SDK.

The DAG is the same sky_job TaskGroup a scheduler runs; only the runner differs. Airflow gets a private
home (`~/.airflow_sky/airflow`, or AIRFLOW_SKY_AIRFLOW_HOME) so the CLI never touches a user's real Airflow.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import getpass
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from airflow_sky.client import events
from airflow_sky.client.limits import raise_open_file_limit
from airflow_sky.errors import SkyError
from airflow_sky.gang.job import JobHandle, Phase
from airflow_sky.infra.home import sky_home
from airflow_sky.infra.ledger import LAUNCHED_BY_ENV
from airflow_sky.task.launch import Launch
from airflow_sky.task.launch import LaunchOptions as LaunchOptions  # the CLI's and the SDK's import
from airflow_sky.task.redaction import task_redactor

AIRFLOW_HOME_ENV = "AIRFLOW_SKY_AIRFLOW_HOME"
KEPT_SETTINGS_PREFIX = "AIRFLOW__SKY__"  # airflow-sky's own settings, the same for the CLI as for DAGs
MIGRATE_TIMEOUT_S = 600  # a first migrate takes ~20 s
_STARTS_PHASE: dict[str, Phase] = {
    "sync": "setup",
    "launch": "run",
}  # the step that starts each phase's scripts


@dataclasses.dataclass
class JobOutcome:
    succeeded: bool
    state: str
    cluster_name: str
    job_id: int | None
    log_file: Path
    step_times: dict[str, tuple[float, float | None]]  # step -> (first start, last end)
    exit_codes: dict[str, dict[int, int | None]]  # "setup"/"run" -> rank -> exit code
    failures: list[str]
    handle: JobHandle | None = None
    result: Any = None  # the head's return.json (collect's XCom), None without one
    by_airflow: bool = True  # False: an exec run without a DAG run (client/exec_direct.py), its own log


def private_airflow_home() -> Path:
    configured = os.environ.get(AIRFLOW_HOME_ENV)
    return Path(configured) if configured else sky_home() / "airflow"


def bind_private_home() -> None:
    """Before anything imports Airflow without a launch (down, queue, logs...): point it at the private
    home, so that importing the SSH provider never creates ~/airflow or reads a user's real Airflow. The
    CLI and the SDK call it first: this process is the user's own, so their git setup may resolve a git
    workdir's ref (node.git_commit; an Airflow worker never does this)."""
    from airflow_sky.node.git_commit import use_machine_git_setup

    use_machine_git_setup()
    if "airflow" not in sys.modules:
        os.environ["AIRFLOW_HOME"] = str(private_airflow_home())


def prepare_airflow() -> Path:
    """Point Airflow at the private home and migrate its DB on first use. Call before importing Airflow."""
    bind_private_home()
    home = private_airflow_home()
    if _active.get("home") == home:
        return home  # prepared already in this process (the SDK prepares before its pre-flight checks)
    if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(home):
        # Airflow is bound to the caller's home (its DB, its dags folder): a launch DAG must not go there.
        raise SkyError(
            "the launch engine needs its private Airflow home, but this process imported Airflow for "
            f"{os.environ.get('AIRFLOW_HOME') or '~/airflow'}: use airflow_sky.launch/exec, which then run "
            "the engine in a process of its own"
        )
    # A dags folder per launching process: dag.test() parses its whole folder into the DB, and two launches
    # at once (concurrent execs) parsing each other's DAG race on creating the same DAG rows. It is made
    # with the launch's files and removed when the launch ends; a killed launch's is removed here.
    for stale in (home / "dags").glob("launch-*"):
        with contextlib.suppress(OSError):
            stale.rmdir()  # only empty ones: a running launch's files are gone once parsed anyway
    dags = home / "dags" / f"launch-{os.getpid()}-{secrets.token_hex(3)}"
    # The private Airflow reads its own airflow.cfg: settings meant for the user's real Airflow (its DB
    # URL, executor, dags folder) must not redirect it. Logging settings are kept, and airflow-sky's own
    # `[sky]` settings (container runtime and options, default store, ...): a launch from the CLI reads them
    # as a DAG's tasks do.
    for name in [
        k
        for k in os.environ
        if k.startswith("AIRFLOW__") and not k.startswith(("AIRFLOW__LOGGING__", KEPT_SETTINGS_PREFIX))
    ]:
        del os.environ[name]
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    os.environ.setdefault(LAUNCHED_BY_ENV, getpass.getuser())  # the owner of the clusters it brings up
    marker = home / ".migrated"
    if not marker.exists():
        _migrate_once(home, marker)
    _active["home"] = home
    return home


def _migrate_once(home: Path, marker: Path) -> None:
    """Migrate the private DB unless another launch did meanwhile. Concurrent first launches (four
    `airflow-sky launch` at once in a fresh home) otherwise race `db migrate` on one sqlite file and all
    but one fail with "table ... already exists"; the lock makes the later ones wait and find the marker."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if marker.exists():
            return
        # Then the dags-folder bundle's row: every dag.test() writes it if missing, and first launches at
        # once raced on that insert ("UNIQUE constraint failed: dag_bundle.name").
        for step in (["-m", "airflow", "db", "migrate"], ["-c", _SYNC_BUNDLES]):
            try:
                proc = subprocess.run(
                    [sys.executable, *step],
                    capture_output=True,
                    text=True,
                    env=os.environ.copy(),
                    timeout=MIGRATE_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired as e:
                raise SkyError(
                    f"initializing the private Airflow DB in {home} did not finish within "
                    f"{MIGRATE_TIMEOUT_S}s (is another process holding {home / 'airflow.db'}?)"
                ) from e
            if proc.returncode != 0:
                raise SkyError(
                    f"could not initialize the private Airflow DB in {home}: {proc.stderr.strip()[-800:]}"
                )
        marker.touch()


_SYNC_BUNDLES = (
    "from airflow.dag_processing.bundles.manager import DagBundlesManager; "
    "DagBundlesManager().sync_bundles_to_db()"
)


def dag_id_for(cluster_name: str) -> str:
    """Unique per launch: two launches on one cluster (concurrent `exec`s) must not share a DAG or its file."""
    return f"sky_launch_{cluster_name.replace('-', '_')}_{secrets.token_hex(4)}"


# The launch running in this process: its files (removed as soon as Airflow has parsed them, and on every
# way out), its log and the Airflow home prepared for it. A Ctrl-C handler reads it (see abandon_launch).
_active: dict[str, Any] = {}


def launch_state() -> dict[str, Any]:
    """The launch running in this process (its log file: what a Ctrl-C hands over), for exec_direct."""
    return _active


def _remove_launch_files() -> None:
    for path in _active.pop("files", ()):
        Path(path).unlink(missing_ok=True)


def _end_launch() -> None:
    """The launch's files and its dags folder go (a next launch in this process makes the folder again)."""
    _remove_launch_files()
    folder = _active.pop("dags_folder", None)
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: never another launch's files


def abandon_launch() -> Path | None:
    """For a Ctrl-C that ends this process: remove the launch's files; returns its log file."""
    _end_launch()
    log_file: Path | None = _active.get("log_file")
    return log_file


def write_launch_files(launch: Launch) -> Path:
    """The private DAG file and its spec (0600: it may hold secrets), for Airflow's parse of the dags
    folder (dag.test() writes the DAG to its DB from there); returns the DAG file's path."""
    from airflow.configuration import conf

    dag_id = dag_id_for(launch.options.cluster_name)
    dags = Path(conf.get("core", "dags_folder"))
    dags.mkdir(parents=True, exist_ok=True)
    _active["dags_folder"] = dags
    spec_path = dags / f"{dag_id}.json"
    dag_path = dags / f"{dag_id}.py"
    fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    _active["files"] = (spec_path, dag_path)
    with os.fdopen(fd, "w") as f:
        f.write(launch.to_json())
    dag_path.write_text(
        '"""Written by airflow-sky launch: the job as a DAG (removed when the launch ends)."""\n'
        "from airflow_sky.client.engine import dag_from_spec_file\n\n"
        f"dag = dag_from_spec_file({str(spec_path)!r})\n"
    )
    return dag_path


def dag_from_spec_file(spec_path: str) -> Any:
    """The launch DAG described by a spec file (see write_launch_files); its DAG id is the file's name."""
    path = Path(spec_path)
    return launch_dag(Launch.from_json(path.read_text()), path.stem)


def launch_dag(launch: Launch, dag_id: str) -> Any:
    """The launch as a DAG: the sky_job TaskGroup a scheduler would run."""
    from airflow.sdk import DAG

    from airflow_sky.dags.job import sky_job

    # A SkyPilot task as written: `{{ }}` in a script is the script's business, not a template.
    from airflow_sky.task.templating import keep_literal  # (jinja2: only a launch needs it)

    task = keep_literal(copy.deepcopy(launch.task))  # it edits in place: the launch's task stays as given
    with DAG(dag_id, schedule=None, catchup=False, tags=["airflow-sky", "launch"]) as dag:
        # The CLI prints every node's log as the follow tasks read it; waiting in a trigger would not.
        sky_job(launch=dataclasses.replace(launch, task=task), group_id="job", deferrable=False)
    return dag


@contextlib.contextmanager
def _output_to(log_file: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (Airflow's own chatter) to `log_file` while the DAG runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for held in (*saved, fd):
            os.close(held)


def run_job(launch: Launch, listener: events.Listener | None = None) -> JobOutcome:
    """Run the job to its end in this process; `listener` receives progress events as they happen.

    An exec on a kept cluster runs without an Airflow DAG run (client.exec_direct: the same steps, ~1 s
    instead of ~10 s); everything else is the sky_job DAG run by dag.test()."""
    from airflow_sky.client import exec_direct

    if exec_direct.handles(launch):
        return exec_direct.run_exec(launch, listener)
    task, options = launch.task, launch.options
    raise_open_file_limit(task.num_nodes)
    home = prepare_airflow()
    from airflow_sky.client.live import LogOrder, NodeLogs, ends_the_logs, task_events
    from airflow_sky.client.queue_watch import QueueWatch
    from airflow_sky.infra.registry import open_cluster

    cluster_name = options.cluster_name  # a host name label already (client.cluster_names)
    cluster = open_cluster(cluster_name, options.infra)  # the launch's one Cluster here
    log_dir = home / "logs" / "launch"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{cluster_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    _active["log_file"] = log_file
    recorder = Recorder()
    listeners: list[events.Listener] = [recorder] if listener is None else [recorder, listener]
    lock = threading.RLock()  # events come from the runner and from the node-log thread
    phases = tuple(p for p, wanted in (("setup", options.setup), ("run", options.follow)) if wanted)
    node_logs: list[NodeLogs] = []
    log_order = LogOrder()
    redact = task_redactor(task)

    def sink(event: events.Event) -> None:
        if event.kind == "task_started":
            _remove_launch_files()  # dag.test() parsed the DAG into its DB before the first task
        if event.text and event.kind != "log":  # node log lines come redacted; errors may quote anything
            event = dataclasses.replace(event, text=redact(event.text))
        quiet = task.setup is None and event.step.startswith("setup_")  # no "Running setup" without one
        # Banners and verdicts after the node lines that led to them. Outside the lock: the node-log
        # thread may be waiting for it while it holds the logs. Before teardown: the logs go with the nodes.
        if log_order.drain_before(event) and node_logs:
            node_logs[0].drain(reconnect=event.step == "teardown")
        if ends_the_logs(event) and node_logs:
            node_logs[0].stop()
        with lock:
            for receive in listeners[:1] if quiet else listeners:
                receive(event)
            if event.kind == "job" and not node_logs and phases:
                handle = JobHandle.from_dict(event.data)
                same = (handle.cluster_name, handle.infra) == (cluster.name, cluster.infra)
                node_logs.append(
                    NodeLogs(
                        cluster if same else open_cluster(handle.cluster_name, handle.infra),
                        handle,
                        sink,
                        redact,
                        cast(tuple[Phase, ...], phases),
                    )
                )
                node_logs[0].start()
            # Each node's sync task starts its setup; launch starts the run on every node.
            if event.kind == "task_started" and event.step in _STARTS_PHASE and node_logs:
                node_logs[0].activate(_STARTS_PHASE[event.step])

    queue_watch: list[QueueWatch] = []  # what the job waits for in the cluster's queue, as `queued` events
    try:
        dag_path = write_launch_files(launch)
        queue_watch.append(QueueWatch(cluster, dag_path.stem, sink))
        queue_watch[0].start()
        with _output_to(log_file), task_events(sink):
            dag_run = launch_dag(launch, dag_path.stem).test()  # the same DAG as the file's, not read back
        state = str(getattr(dag_run.state, "value", dag_run.state))
    finally:
        for watcher in node_logs:
            watcher.stop()
        for watch in queue_watch:
            watch.stop()
        _end_launch()
        _active.pop("log_file", None)
    return recorder.outcome(state, cluster_name, log_file)


class Recorder:
    """Keeps what the summary needs from the event stream."""

    def __init__(self) -> None:
        self.job_id: int | None = None
        self.handle: JobHandle | None = None
        self.step_times: dict[str, tuple[float, float | None]] = {}
        self.exit_codes: dict[str, dict[int, int | None]] = {"setup": {}, "run": {}}
        self.failures: list[str] = []
        self.result: Any = None

    def outcome(self, state: str, cluster_name: str, log_file: Path, by_airflow: bool = True) -> JobOutcome:
        """The launch's outcome: its DAG run's `state` and what the events told."""
        return JobOutcome(
            by_airflow=by_airflow,
            succeeded=state == "success" and not self.failures,
            state=state,
            cluster_name=cluster_name,
            job_id=self.job_id,
            log_file=log_file,
            step_times=self.step_times,
            exit_codes=self.exit_codes,
            failures=self.failures,
            handle=self.handle,
            result=self.result,
        )

    def __call__(self, event: events.Event) -> None:
        if event.kind == "result":
            self.result = event.data.get("value")
        elif event.kind == "job":
            self.handle = JobHandle.from_dict(event.data)
            self.job_id = self.handle.job_id
        elif event.kind == "task_started":
            start, end = self.step_times.get(event.step, (event.at, None))
            self.step_times[event.step] = (min(start, event.at), end)
        elif event.kind == "task_done":
            start, end = self.step_times.get(event.step, (event.at, None))
            self.step_times[event.step] = (start, max(end or event.at, event.at))
        elif event.kind == "task_failed" and not event.step.endswith("_follow"):
            self.failures.append(f"{event.step}: {event.text}")
        elif event.kind == "exit" and event.rank is not None:
            phase = "setup" if event.step.startswith("setup") else "run"
            self.exit_codes[phase][event.rank] = event.exit_code
            if event.exit_code != 0 and event.text and event.text not in self.failures:
                self.failures.append(event.text)
