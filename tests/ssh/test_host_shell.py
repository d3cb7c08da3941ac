"""The shell the ssh infra runs on a host (clean, probe), run in a real local bash."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from airflow_sky.infra.ssh import hosts
from airflow_sky.node.processes import JOB_MARK_ENV


def _bash(script: str, home: Path, stdin: str = "") -> str:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(
        ["bash", "-c", script], input=stdin, env=env, capture_output=True, text=True, check=True
    ).stdout


def test_clean_stops_the_jobs_processes_and_removes_their_records(tmp_path: Path) -> None:
    """A job's processes carry its mark (node.processes), which is how `clean` finds them, setsid or not; its
    pid file is the job's to write and is never believed (here it names the script that runs `clean`, which
    must survive). In a PID namespace of its own: run as root, `clean` ends every marked process it sees,
    and other tests' local nodes run marked jobs on this machine."""
    gen = tmp_path / ".airflow_sky" / "jobs" / "1-run" / "gen-0"
    gen.mkdir(parents=True)
    mark = shlex.quote(f"{JOB_MARK_ENV}=1-run/gen-0")
    script = f"""\
echo $$ > {shlex.quote(str(gen / "pid"))}
( export {mark}; setsid bash -c 'sleep 300 & wait' & )
marked_now() {{ grep -lzxF -- {mark} /proc/[0-9]*/environ 2>/dev/null | wc -l; }}
i=0; while [ "$(marked_now)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
echo "before $(marked_now)"
( {hosts.clean_command()} ) > /dev/null
echo "after $(marked_now)"
"""
    out = _bash(f"exec unshare --pid --fork --mount-proc bash -c {shlex.quote(script)}", tmp_path)
    assert "before 2" in out, out  # the job's shell and its sleep
    assert "after 0" in out, out
    assert not (tmp_path / ".airflow_sky" / "jobs").exists()


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
