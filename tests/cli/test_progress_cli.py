"""A job's progress through the real CLI and SDK on a real 2-node local cluster: a job whose ranks echo
`@@airflow-sky-progress/1` lines shows its step (its slowest rank's), percent and ETA in `queue` while it runs
and after it ended, `progress` prints every rank's step, rate and loss, the SDK returns the progress
document; a job that reports nothing shows `-`. No output shows a report line (launch, exec, logs, the follow tasks' Airflow log): one compact `progress:` line instead; `logs --raw` shows the log as written. A metric reported
every 25 steps stays in `progress` between reports, also for an `exec -d` job, whose progress is collected
when it is read. `logs -s` of a job whose node is gone fails at once and leaves no folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli import test_jobs_cli
from tests.cli.test_job_queue_cli import Reader, kept_cluster

# The CLI in a private sky home for this module (the `env` fixture), as the kept-cluster tests run it.
CLI, cli, env = test_jobs_cli.CLI, test_jobs_cli.cli, test_jobs_cli.env

CLUSTER = "progress-c"

# Rank 0 runs ahead to step 6, rank 1 stops at step 3 until $RELEASE exists; then rank 0 reports step 10 and
# rank 1 step 9 of 10, their last. Each report carries its own time, one second a step, so each rank's rate
# is 1 step/s whatever the load on the machine, and the job's ETA is the slowest rank's: (10 - 3) / 1 = 7 s.
# The slow rank is rank 1 on purpose: an in-process exec runs its follow tasks one after another (rank 0's
# first), so its step is live only because the exec's node-log reader records every rank's reports.
REPORTING = """\
name: reporting
num_nodes: 2
run: |
  T0=$(( $(date +%s) - 10 ))
  LAST=$(( SKYPILOT_NODE_RANK == 1 ? 3 : 6 ))
  for i in $(seq 1 $LAST); do
    echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"total\\":10,\\"time\\":$((T0 + i)),\\"metrics\\":{\\"loss\\":$((10 - i)).5}}"
  done
  while [ ! -f "$RELEASE" ]; do sleep 0.2; done
  FINAL=$(( SKYPILOT_NODE_RANK == 0 ? 10 : 9 ))
  echo "@@airflow-sky-progress/1 {\\"step\\":$FINAL,\\"total\\":10,\\"time\\":$((T0 + 20)),\\"metrics\\":{\\"loss\\":0.25}}"
"""


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kept 2-node cluster whose job 1 reported nothing."""
    yield from kept_cluster(env, tmp_path_factory.mktemp("up"), CLUSTER, job="silent")


def queue_rows(env: dict[str, str], cluster: str) -> dict[str, dict[str, str]]:
    """job id -> the row's cells by column, from `queue` wide enough for every cell to stay on its line."""
    out = cli({**env, "COLUMNS": "200"}, "queue", cluster)
    assert out.returncode == 0, out.stdout + out.stderr
    # (the header's rules are heavy: ┃)
    rows = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in out.stdout.splitlines()]
    header = next(row for row in rows if row and row[0] == "ID")
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows if row and row[0].isdigit()}


def wait_for(what: str, check: Callable[[], object], timeout: float = 300) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1.0)
    raise AssertionError(f"{what} never came; last: {last}")


def sdk_progress(env: dict[str, str], cluster: str, job_id: str) -> dict:
    script = f"import json, airflow_sky as sky; print(json.dumps(sky.job_progress({cluster!r}, {job_id})))"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_reporting_job_shows_its_slowest_ranks_step_and_eta_while_it_runs_and_after(env, cluster, tmp_path):
    release = tmp_path / "release"
    (tmp_path / "reporting.yaml").write_text(REPORTING)
    # A followed exec (its node-log reader records every rank's reports as it shows the lines), read from
    # here as another terminal would.
    execute = Reader(env, "exec", cluster, str(tmp_path / "reporting.yaml"), "--env", f"RELEASE={release}")
    job = execute.wait_for(f" on cluster {cluster} ").split("Job ", 1)[1].split()[0]
    try:
        seen: list[dict[str, dict[str, str]]] = [{}]  # the last queue read, for the failure message

        def slowest_step_shown() -> object:
            seen[0] = queue_rows(env, cluster)
            return seen[0].get(job, {}).get("PROGRESS") == "3/10 30%" and seen[0]

        try:
            rows = wait_for(f"job {job}'s progress 3/10 in the queue", slowest_step_shown)
        except AssertionError as missing:
            raise AssertionError(f"{missing}; the queue's last rows: {seen[0]}") from None
        assert isinstance(rows, dict)
        assert rows[job]["STATUS"] == "RUNNING" and rows[job]["ETA"] == "7s", rows
        assert rows["1"]["PROGRESS"] == "-" and rows["1"]["ETA"] == "-", rows  # job 1 reported nothing

        doc = sdk_progress(env, cluster, job)
        assert (doc["job_id"], doc["status"], doc["step"], doc["total"]) == (int(job), "RUNNING", 3, 10), doc
        assert doc["percent"] == 30.0 and doc["rate"] == 1.0 and doc["eta_s"] == 7.0, doc
        assert doc["slowest_rank"] == 1, doc
        ranks = {r["rank"]: r for r in doc["ranks"]}
        assert (ranks[1]["step"], ranks[1]["metrics"], len(ranks[1]["history"])) == (3, {"loss": 7.5}, 3), doc
        assert ranks[0]["step"] == 6, doc  # ahead: not the job's step

        shown = cli({**env, "COLUMNS": "200"}, "progress", cluster, job)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"Job {job} on {cluster}: RUNNING, step 3/10 30%, 1/s, ETA 7s" in shown.stdout, shown.stdout
        table = rank_rows(shown.stdout)
        assert table["1"][1:4] == ["3/10 30%", "1/s", "7.5"] and table["0"][1] == "6/10 60%", shown.stdout
        # --watch reads on until the job ends (on no terminal, only its last view is printed).
        watcher = Reader(env, "progress", cluster, job, "--watch", "--interval", "0.5")
    finally:
        release.touch()
    assert execute.finish() == 0, execute.output
    assert watcher.finish() == 0, watcher.output
    # The exec showed no report line, but the job's compact progress line (its last one at the run's end).
    assert "@@airflow-sky-progress" not in execute.output, execute.output
    assert "progress: step 9/10 90%" in execute.output and "loss=0.25" in execute.output, execute.output
    # Ended: every rank's last report is in; the job's step is the slowest rank's, and it has no ETA.
    rows = queue_rows(env, cluster)
    assert rows[job]["STATUS"] == "SUCCEEDED" and rows[job]["PROGRESS"] == "9/10 90%", rows
    assert rows[job]["ETA"] == "-", rows
    doc = sdk_progress(env, cluster, job)
    assert (doc["step"], doc["slowest_rank"], doc["eta_s"]) == (9, 1, None), doc
    assert [(r["rank"], r["step"], r["metrics"]) for r in doc["ranks"]] == [
        (0, 10, {"loss": 0.25}),
        (1, 9, {"loss": 0.25}),
    ], doc
    shown = cli({**env, "COLUMNS": "200"}, "progress", cluster)  # the latest job: this one
    assert f"Job {job} on {cluster}: SUCCEEDED, step 9/10 90%" in shown.stdout, shown.stdout
    assert "slowest rank 1" in shown.stdout and "2/2 ranks reporting" in shown.stdout, shown.stdout
    assert [rank_rows(shown.stdout)[r][1] for r in ("0", "1")] == ["10/10 100%", "9/10 90%"], shown.stdout
    latest = cli(env, "progress", cluster, "--json")
    assert latest.returncode == 0, latest.stderr
    assert json.loads(latest.stdout)["step"] == 9


def rank_rows(out: str) -> dict[str, list[str]]:
    """rank -> its row's cells, from `progress`'s table."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()]
    return {row[0]: row for row in rows if len(row) > 3 and row[0].isdigit()}


def test_a_job_that_reports_nothing_shows_a_dash_and_says_why(env, cluster):
    shown = cli(env, "progress", cluster, "1")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"Job 1 on {cluster}: SUCCEEDED" in shown.stdout
    assert "No progress reported" in shown.stdout and "@@airflow-sky-progress/1" in shown.stdout
    doc = sdk_progress(env, cluster, "1")
    assert doc["reported_ranks"] == 0 and doc["step"] is None and doc["ranks"] == [], doc


def test_progress_of_an_unknown_job_or_cluster_is_one_error_line(env, cluster):
    for argv, message in {
        ("progress", cluster, "99"): f"cluster {cluster!r} has no job 99",
        ("progress", cluster, "0"): "job id: must be a positive integer",
        ("progress", "no-such-c"): "cluster 'no-such-c' not found",
        ("progress", cluster, "--watch", "--json"): "--json and --watch cannot be combined",
    }.items():
        result = cli(env, *argv)
        assert result.returncode != 0 and message in result.stderr, (argv, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr, argv


def test_logs_show_the_compact_line_instead_of_report_lines_and_raw_shows_the_log_as_written(env, cluster):
    job = json.loads(cli(env, "progress", cluster, "--json").stdout)["job_id"]  # the reporting job
    shown = cli(env, "logs", cluster, str(job), "--no-follow")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "@@airflow-sky-progress" not in shown.stdout, shown.stdout
    assert [line for line in shown.stdout.splitlines() if line.startswith("progress: ")] == [
        "progress: step 9/10 90% · 0.421/s · loss=0.25"
    ], shown.stdout
    followed = cli(env, "logs", cluster, str(job))
    assert followed.returncode == 0 and "@@airflow-sky-progress" not in followed.stdout, followed.stdout
    assert (
        "progress: step 9/10 90%" in followed.stdout
        and f"Job {job} on {cluster} SUCCEEDED" in followed.stdout
    )
    raw = cli(env, "logs", cluster, str(job), "--no-follow", "--raw")
    assert raw.returncode == 0, raw.stdout + raw.stderr
    reports = [line for line in raw.stdout.splitlines() if "@@airflow-sky-progress/1 {" in line]
    assert len(reports) == 7 + 4 and "progress: " not in raw.stdout, raw.stdout  # rank 0: 7, rank 1: 4
    assert reports[0].startswith("(head, rank=0") and '"step":1,' in reports[0], reports
    wrong = cli(env, "logs", cluster, "--raw", "--status")
    assert wrong.returncode != 0 and "--raw" in wrong.stderr and "Traceback" not in wrong.stderr


# The step every step, the loss every 25 steps (as minGPT reports), then held until $RELEASE exists.
EVERY_25 = """\
name: every25
run: |
  T0=$(( $(date +%s) - 40 ))
  for i in $(seq 1 30); do
    if [ $i -eq 25 ]; then LOSS=',"metrics":{"loss":2.5}'; else LOSS=''; fi
    echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"total\\":40,\\"time\\":$((T0 + i))$LOSS}"
  done
  while [ ! -f "$RELEASE" ]; do sleep 0.2; done
  echo "@@airflow-sky-progress/1 {\\"step\\":31,\\"total\\":40}"
"""


def test_a_detached_jobs_progress_is_collected_and_a_loss_reported_every_25_steps_stays(
    env, cluster, tmp_path
):
    release = tmp_path / "release"
    (tmp_path / "every25.yaml").write_text(EVERY_25)
    started = cli(env, "exec", cluster, str(tmp_path / "every25.yaml"), "-d", "--env", f"RELEASE={release}")
    assert started.returncode == 0, started.stdout + started.stderr
    job = started.stdout.split(" on cluster ", 1)[0].rsplit("Job ", 1)[1].split()[0]
    try:

        def thirty_steps() -> object:
            doc = json.loads(cli(env, "progress", cluster, job, "--json").stdout)
            return doc if doc["step"] == 30 else None

        doc = wait_for(f"job {job}'s step 30 in `progress`", thirty_steps)
        assert isinstance(doc, dict) and doc["status"] == "RUNNING", doc
        assert doc["ranks"][0]["metrics"] == {"loss": 2.5} and doc["metrics"] == {"loss": 2.5}, doc
        shown = cli({**env, "COLUMNS": "200"}, "progress", cluster, job)
        assert rank_rows(shown.stdout)["0"][1:4] == ["30/40 75%", "1/s", "2.5"], shown.stdout
    finally:
        release.touch()

    def ended() -> object:
        rows = queue_rows(env, cluster)
        return rows.get(job, {}).get("STATUS") == "SUCCEEDED"

    wait_for(f"job {job} SUCCEEDED", ended)
    doc = json.loads(cli(env, "progress", cluster, job, "--json").stdout)
    assert (doc["step"], doc["ranks"][0]["metrics"]) == (31, {"loss": 2.5}), doc


QUICK = """\
name: quick
num_nodes: 2
run: |
  for i in 1 2 3; do
    echo "@@airflow-sky-progress/1 {\\"step\\":$i,\\"total\\":3,\\"metrics\\":{\\"loss\\":$i.5}}"
    echo "plain $i"
  done
"""


def test_a_launchs_output_and_its_follow_tasks_airflow_log_show_the_progress_line_not_the_reports(
    env, cluster, tmp_path
):
    (tmp_path / "quick.yaml").write_text(QUICK)
    launched = cli(env, "launch", "-c", cluster, str(tmp_path / "quick.yaml"), "-y")  # a DAG run, in-process
    out = launched.stdout + launched.stderr
    assert launched.returncode == 0, out
    assert "plain 3" in out and "@@airflow-sky-progress" not in out, out
    assert "progress: step 3/3 100%" in out and "loss=3.5" in out, out
    airflow_log = Path(out.split("Airflow log of this launch: ", 1)[1].split()[0]).read_text()
    assert "plain 3" in airflow_log and "@@airflow-sky-progress" not in airflow_log, airflow_log[-4000:]
    for prefix in ("(head, rank=0, ", "(worker1, rank=1, "):
        assert any(
            prefix in line and ") progress: step 3/3 100%" in line for line in airflow_log.splitlines()
        ), airflow_log[-4000:]


def test_logs_sync_down_of_a_job_whose_node_is_gone_fails_at_once_and_leaves_nothing(env, cluster, tmp_path):
    """Last in the module: it preempts the cluster's worker (its jobs ran on both nodes)."""
    home = tmp_path / "home"
    home.mkdir()
    synced = cli({**env, "HOME": str(home)}, "logs", cluster, "1", "--sync-down")  # job 1 ran on both nodes
    assert synced.returncode == 0 and (home / "sky_logs" / cluster / "1-silent" / "1-worker1.log").exists()
    preempted = cli(env, "local", "preempt", cluster, "1")
    assert preempted.returncode == 0, preempted.stdout + preempted.stderr
    gone = cli({**env, "HOME": str(home)}, "logs", cluster, "1", "--sync-down")
    assert gone.returncode != 0, gone.stdout + gone.stderr
    assert "logs --sync-down: the node of rank 1 (" in gone.stderr and "nothing was written" in gone.stderr
    assert "Traceback" not in gone.stderr
    # The earlier download stays as it was; no half-written folder or staging folder is left beside it.
    assert sorted(p.name for p in (home / "sky_logs" / cluster).iterdir()) == ["1-silent"]
