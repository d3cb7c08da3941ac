"""`airflow-sky jobs pool apply | status | down` on local workers: a bad pool file is refused before anything
starts, status names the job a worker runs, and down cancels it before the workers go, leaving nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from airflow_sky.infra.local import daemon
from airflow_sky.infra.local.cloud import LocalCloud

CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_a_pool_file_with_a_run_or_a_bad_name_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("pool:\n  workers: 1\nrun: echo hi\n")
    bad = _cli("jobs", "pool", "apply", "-p", "refused", str(path), "-y")
    assert bad.returncode == 2 and "run: a pool file may not have a run section" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    name = _cli("jobs", "pool", "apply", "-p", "Bad_Name", str(path), "-y")
    assert name.returncode == 2 and "pool name 'Bad_Name' is invalid" in name.stderr, name.stderr
    assert not [c for c in LocalCloud().clusters() if c.startswith("refused")]


def test_status_shows_a_workers_job_and_down_cancels_it_and_leaves_nothing(tmp_path: Path) -> None:
    pool = "downp"
    (tmp_path / "pool.yaml").write_text("pool:\n  workers: 2\nsetup: echo ready\n")
    try:
        applied = _cli("jobs", "pool", "apply", "-p", pool, str(tmp_path / "pool.yaml"), "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        started = _cli("exec", f"{pool}-0", "-d", "sleep 300")
        assert started.returncode == 0, started.stdout + started.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            "sleep" in p.name() for p in daemon.processes_with_marker(f"{pool}-0")
        ):
            time.sleep(0.5)
        status = _cli("jobs", "pool", "status")
        assert status.returncode == 0, status.stderr
        assert f"{pool}: 1/2 busy, 0 job(s) pending" in status.stdout and "RUNNING" in status.stdout, (
            status.stdout
        )
    finally:
        down = _cli("jobs", "pool", "down", pool, "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"Worker {pool}-0: cancelled job(s) 2" in down.stdout, down.stdout
    assert not [c for c in LocalCloud().clusters() if c.startswith(pool)]
    assert daemon.processes_with_marker(f"{pool}-0") == [] and daemon.processes_with_marker(f"{pool}-1") == []
