"""The shell the ssh infra runs on a host (clean, probe), run in a real local bash."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import psutil

from airflow_sky.infra.ssh import hosts
from airflow_sky.node.processes import JOB_MARK_ENV


def _bash(script: str, home: Path, stdin: str = "") -> str:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(
        ["bash", "-c", script], input=stdin, env=env, capture_output=True, text=True, check=True
    ).stdout


def test_clean_stops_the_jobs_processes_and_removes_their_records(tmp_path: Path) -> None:
    """A job's processes carry its mark (node.processes), which is how `clean` finds them; its pid file is
    the job's to write and is never believed (here it names this test's own process)."""
    gen = tmp_path / ".airflow_sky" / "jobs" / "1-run" / "gen-0"
    gen.mkdir(parents=True)
    (gen / "pid").write_text(f"{os.getpid()}\n")
    job = subprocess.Popen(
        ["bash", "-c", f"touch {gen}/started; sleep 300 & wait"],
        start_new_session=True,
        env={**os.environ, JOB_MARK_ENV: "1-run/gen-0"},
    )
    deadline = time.monotonic() + 30
    while not (gen / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pgid = job.pid
    _bash(hosts.clean_command(), tmp_path)
    job.wait(timeout=30)
    assert not (tmp_path / ".airflow_sky" / "jobs").exists()
    # No live process left in the group (a killed orphan may linger as a zombie where PID 1 does not reap).
    deadline = time.monotonic() + 30
    while _live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_in_group(pgid) == []


def _live_in_group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


def test_the_probe_reports_tools_addresses_and_gpus(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/bash\necho 'NVIDIA L4, 2'\necho 'NVIDIA L4, 2'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "-c", hosts.probe_command()], env=env, capture_output=True, text=True
    ).stdout
    facts = hosts.parse_probe(out)
    assert facts.bash != "-" and facts.python != "-"
    assert facts.gpus.names == ("NVIDIA L4", "NVIDIA L4")


def test_a_public_pool_address_gives_way_to_the_hosts_private_one() -> None:
    assert hosts.internal_ip("10.0.0.5", ("10.0.0.5",)) == "10.0.0.5"
    assert hosts.internal_ip("127.0.200.2", ()) == "127.0.200.2"
    assert hosts.internal_ip("34.1.2.3", ("34.1.2.3", "172.17.0.1", "10.128.0.7")) == "10.128.0.7"
    assert hosts.internal_ip("34.1.2.3", ("34.1.2.3",)) == "34.1.2.3"
