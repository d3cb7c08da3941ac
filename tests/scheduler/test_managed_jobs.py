"""Managed jobs on a real Airflow (`airflow standalone` in a private network namespace), through the CLI.

See jobs_driver.py for the scenario, on Airflow's default `dags_are_paused_at_creation = True` (the DAG
comes up unpaused; paused by hand, `jobs launch` refuses naming the fix): a bad task refused locally;
hostile run confs refused by the deployment's policy; a job launched from the CLI, the CLI killed, a node
preempted, the job recovered by Airflow alone; a second job cancelled with nothing left running; a
pipeline; a job whose local workdir and file went through the jobs bucket (moto's S3 in the namespace).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon
from tests.scheduler.jobs_driver import HOSTILE, SECRET, WORKER_KEY
from tests.scheduler.stack import run_in_private_network, terminate_clusters

DRIVER = Path(__file__).with_name("jobs_driver.py")
# The driver has its own 1200 s limit (a fresh stack, eight launches, a recovery): pytest must not cut it first.
pytestmark = pytest.mark.timeout(1300)


def test_a_managed_job_starts_on_a_fresh_stack_outlives_its_cli_recovers_a_preempted_node_and_a_cancelled_one_leaves_no_node(
    tmp_path: Path,
):
    home = tmp_path / "airflow"
    probe = tmp_path / "probe"
    probe.mkdir()
    config = {"home": str(home), "probe": str(probe)}
    try:
        driver, report_path = run_in_private_network([sys.executable, str(DRIVER)], tmp_path, config, 1200)
        log_path = home / "standalone.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        assert driver.returncode == 0 and report_path.exists(), driver.stdout + driver.stderr + log[-5000:]
        report = json.loads(report_path.read_text())
        context = json.dumps(report, indent=1)[-12000:] + "\n" + log[-4000:]
        assert "error" not in report, context

        # A bad task never reaches Airflow.
        assert report["bad"]["rc"] == 2 and "num_nodes" in report["bad"]["output"], context
        # Airflow pauses new DAGs here (its default), but not this one; paused, a launch is refused with the fix.
        assert report["paused_at_start"] is False, context
        paused = report["paused"]
        assert paused["rc"] == 2 and "submitted" not in paused["stdout"], context
        (line,) = paused["stderr"].strip().splitlines()  # one line, no traceback
        assert "is paused" in line and "`airflow dags unpause airflow_sky_jobs`" in line, context
        assert report["runs_after_bad"] == 0, context  # neither the bad task nor the paused launch made a run

        # The CLI followed the job until it was killed; the job went on without it and recovered.
        assert "rank 0 gen 0 token=***" in report["launch_output"] or "gen 0" in report["launch_output"], (
            context
        )
        assert report["train_statuses"][-1] == "SUCCEEDED", context
        assert "RECOVERING" in report["train_statuses"], context
        assert sorted(report["train_starts"]) == ["0 0", "0 1", "1 0", "1 1"], context  # once per generation
        queue_line = next(line for line in report["train_queue"].splitlines() if report["train_job"] in line)
        assert queue_line.split()[-2:] == ["1", "SUCCEEDED"], queue_line  # one recovery
        assert max(map(len, report["train_queue"].splitlines())) <= 80, report["train_queue"]
        assert "…" not in report["train_queue"].splitlines()[0], report["train_queue"]  # whole headers
        # Its progress, from the deployment's plugin (its entry point, loaded once): step 3 of 10 while it
        # ran, its last step after.
        assert "airflow_sky" in report["plugins"] and report["plugin_import_errors"] == [], context
        live = next(line for line in report["train_live_queue"].splitlines() if report["train_job"] in line)
        assert "3/10 30%" in live and "RUNNING" in live, report["train_live_queue"]
        ended = next(line for line in report["train_queue_wide"].splitlines() if report["train_job"] in line)
        assert ended.split()[-5:] == ["10/10", "100%", "-", "1", "SUCCEEDED"], report["train_queue_wide"]
        logs = report["train_logs"]
        for rank in (0, 1):
            for gen in (0, 1):
                assert f"rank {rank} gen {gen} token=***" in logs, context
        assert "Relaunching job" in logs, context

        # The secret reached the ranks (masked in every log), never the conf, and its Variable is gone.
        assert SECRET not in json.dumps(report), context
        assert report["train_conf"]["secrets"] == ["TOKEN"], context  # the name only
        assert not any(key.startswith("airflow_sky_secret__") for key in report["variables"]), context

        # The cancelled job: every rank stopped, its nodes torn down.
        assert report["long_statuses"][-1] == "CANCELLED", context
        assert report["long_nodes_left"] == 0 and report["clusters_left"] == [], context
        # Nothing of its cluster is left: no state/progress written by its killed follow tasks.
        assert report["long_leftovers"] == "success" and report["long_folder_left"] == [], context

        # A pipeline runs its tasks in order in one run; a longer one than the DAG has slots for is refused.
        assert report["pipeline3"]["rc"] != 0 and "pipeline_slots=3" in report["pipeline3"]["output"], context
        assert report["pipeline_status"] == "SUCCEEDED", context
        assert report["pipeline_trained"] == ["0", "1"], context
        # Local files through the jobs bucket: uploaded by the CLI (the workdir's .gitignore honoured), copied
        # by every rank, next to an s3:// file_mount; the run's prefix removed at its end, and the cancelled
        # job's too.
        files = report["files"]["output"]
        assert report["files"]["rc"] == 0 and report["files_status"] == "SUCCEEDED", context
        assert "Uploaded 4 local file(s)" in files and "s3://sky-jobs/uploads/sky-job-" in files, context
        for rank in (0, 1):
            for line in ("workdir: hello from the workdir", "file: lr=0.1", "bucket: from the inputs bucket"):
                assert f"rank {rank} {line}" in files, context
        assert "has debug.log" not in files, context
        conf = report["files_conf"]
        assert "workdir" not in conf["task"] and conf["uploads"].startswith("s3://sky-jobs/uploads/"), context
        assert conf["task"]["file_mounts"]["~/inputs"] == "s3://inputs/data", context
        assert report["files_left"] == [] and report["jobs_bucket_left"] == [], context
        assert report["long_uploaded"] is True, context
        # A pool's jobs: set up once per worker, 3 jobs with their ranks, never more than 2 at once.
        assert report["pool_apply"]["rc"] == 0, context
        assert (
            report["pool_refused"]["rc"] == 2
            and "setup: a job for a pool may not have setup" in (report["pool_refused"]["output"])
        ), context
        assert (
            report["pool_launch"]["rc"] == 0
            and "Jobs submitted with IDs: " in report["pool_launch"]["output"]
        )
        assert report["pool_statuses"] == ["SUCCEEDED"] * 3, context
        assert len(report["pool_setups"]) == 2, context  # at apply, once per worker
        starts = sorted(line.split()[1:3] for line in report["pool_jobs"] if line.startswith("start"))
        assert starts == [["0", "3"], ["1", "3"], ["2", "3"]], context
        spans = {}
        for line in report["pool_jobs"]:
            kind, rank, _, at = line.split()
            spans.setdefault(rank, {})[kind] = float(at)
        for span in spans.values():
            assert sum(1 for s in spans.values() if s["start"] <= span["start"] <= s["end"]) <= 2, context
        assert "Pool mpool, pooled: 3 job(s): 3 succeeded" in report["pool_queue"], context
        assert report["pool_status"].count("idle") == 2 and "0/2 busy" in report["pool_status"], context
        assert report["pool_down"]["rc"] == 0, context
        # train, long, pipeline, files, 3 pool jobs and the two hostile confs: none the CLI refused.
        assert report["runs_total"] == 9, context
        # The hostile confs: refused by the deployment's policy in the spec task, before any node.
        worker_path, infra = (report["hostile"][run_id] for run_id in HOSTILE)
        assert "task.file_mounts./tmp/k" in worker_path["spec_log"], context
        assert "names a path on the Airflow worker" in worker_path["spec_log"], context
        assert "infra: aws/us-east-1 is not allowed here; allowed: local" in infra["spec_log"], context
        # `jobs logs` (and a following `jobs launch`) says why, in one line.
        assert "spec failed: the run conf: infra: aws/us-east-1 is not allowed here" in infra["cli_logs"], (
            context
        )
        assert "spec failed: the run conf: task.file_mounts./tmp/k (" in worker_path["cli_logs"], context
        for refused in (worker_path, infra):
            assert refused["state"] == "failed" and refused["queue"] == "FAILED_PRECHECKS", context
            assert refused["provision"] not in ("success", "running", "failed"), context
            assert WORKER_KEY not in refused["spec_log"], context
        assert not (probe / "hostile-ran").exists()
        assert daemon.processes_with_marker("managed-") == []
    finally:
        terminate_clusters("managed-")
        terminate_clusters("airflow-sky-jobs")  # the pipeline's, one per task
