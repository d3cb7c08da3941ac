"""Tearing down an ssh-pool cluster ends everything its jobs left on the host, on real OpenSSH servers: a job
that called `setsid`, forked twice or cleared its environment is gone after teardown, pid files or not; other
users' processes, and the SSH session running the sweep, are untouched (the host is released after it)."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import time

import psutil

from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import read_job, start_job
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 2
SUBNET = 2


def _sleeps(tag: str, user: str | None = None) -> list[str]:
    """`<user> <duration>` of this machine's live `sleep <tag>...` processes (of `user` only, if given)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "username"]):
        cmdline = proc.info["cmdline"] or []
        ours = len(cmdline) == 2 and cmdline[0] == "sleep" and cmdline[1].startswith(tag)
        if ours and proc.info["status"] != psutil.STATUS_ZOMBIE and user in (None, proc.info["username"]):
            found.append(f"{proc.info['username']} {cmdline[1]}")
    return sorted(found)


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_teardown_ends_setsid_double_fork_and_cleared_env_leftovers_and_nothing_else(
    sshd_pool: SshdPool,
) -> None:
    cloud = SshCloud(POOL)
    (node,) = cloud.provision(ProvisionRequest("sweep", 1))
    other = next(h for h in sshd_pool.hosts if h.user != node.ssh_user)
    tag = f"{1000 + secrets.randbelow(8000)}.{secrets.randbelow(10**6)}"
    script = (
        f"setsid sleep {tag}1 < /dev/null > /dev/null 2>&1 & "
        f"( ( sleep {tag}2 < /dev/null > /dev/null 2>&1 & ) & ) ; "
        f"env -i setsid sleep {tag}3 < /dev/null > /dev/null 2>&1 & "
        f"( env -i setsid sh -c 'sleep {tag}4 & exit 0' < /dev/null > /dev/null 2>&1 & ) ; "
        # Its pid file names nothing of its own any more: teardown must not need it.
        'rm -f "$AIRFLOW_SKY_JOB_DIR/gen-0/pid"; exit 0'
    )
    bystanders = [
        subprocess.Popen(["runuser", "-u", other.user, "--", "sleep", f"{tag}8"]),  # another pool user's
        subprocess.Popen(["sleep", f"{tag}9"]),  # this machine's own (root)
    ]
    try:
        with NodeClient(node, cloud.key_file_for("sweep", node)) as client:
            assert start_job(client, "1-run", script, {}).started
            _wait(lambda: read_job(client, "1-run", 0, 0).exit_code is not None, "the job did not end")
        _wait(lambda: len(_sleeps(tag, node.ssh_user)) == 4, "the job's leftovers did not start")
        cloud.terminate("sweep")
        _wait(lambda: _sleeps(tag, node.ssh_user) == [], f"leftovers outlived teardown: {_sleeps(tag)}", 30)
        assert _sleeps(tag) == sorted([f"{other.user} {tag}8", f"root {tag}9"])
        assert sshd_pool.locked_hosts() == [], "the sweep ended the session that was to release the host"
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if (proc.info["cmdline"] or [""])[-1].startswith(tag):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        for popen in bystanders:
            popen.kill()
            popen.wait()
