"""Running stack_driver.py inside a private network namespace, from a test."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).with_name("stack_driver.py")
REPO = Path(__file__).resolve().parents[2]
CLEANUP_GRACE_S = 90  # a driver's cleanup: its Airflow, database and ssh hosts


def run_in_private_network(
    driver: list[str], tmp_path: Path, config: dict[str, Any], timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `driver CONFIG REPORT` under `unshare --net` (from the repository root); returns it and REPORT."""
    assert shutil.which("unshare") and shutil.which("ip"), "needs util-linux unshare and iproute2 (bootstrap)"
    (tmp_path / "config.json").write_text(json.dumps(config))
    report_path = tmp_path / "report.json"
    args = ["unshare", "--net", "--", *driver, str(tmp_path / "config.json"), str(report_path)]
    # Not subprocess.run(timeout=...): it SIGKILLs the driver, whose cleanup (its sshd hosts, PostgreSQL,
    # Redis, Airflow, each in a session of its own) then never runs. On a timeout, or the test itself being
    # interrupted, the driver gets SIGTERM (stop_on_sigterm makes it SystemExit) and time to clean up.
    with subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except BaseException:
            proc.terminate()
            try:
                proc.communicate(timeout=CLEANUP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), report_path


def stop_on_sigterm() -> None:
    """In a driver: SIGTERM raises SystemExit, so that its `finally` cleanup runs (see run_in_private_network)."""

    def exit_now(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)


def run_stack(tmp_path: Path, config: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], str]:
    """Run the driver with `config` (its `home` under tmp_path); returns (its report, the stack's log)."""
    driver, report_path = run_in_private_network([sys.executable, str(DRIVER)], tmp_path, config, timeout_s)
    log_path = Path(config["home"]) / "standalone.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    assert driver.returncode == 0 and report_path.exists(), driver.stdout + driver.stderr + log[-5000:]
    return json.loads(report_path.read_text()), log


def terminate_clusters(prefix: str) -> None:
    """Terminate the local clusters whose name starts with `prefix` (what a failed or aborted run left up)."""
    from airflow_sky.infra.local.cloud import LocalCloud

    cloud = LocalCloud()
    for name in cloud.clusters():
        if name.startswith(prefix):
            cloud.terminate(name)
