"""What a job can write on its node controls nothing that runs or is killed for another job (real local nodes,
real SSH): a cancel ends every process of the job (setsid and double fork included) and nothing else, even
when the job rewrote its pid file to name a bystander; a flush file a job planted never runs in a later job;
tearing a cluster down ends whatever a job left, even with its environment cleared."""

from __future__ import annotations

import secrets
import time

import psutil
import pytest

from airflow_sky.infra.local import daemon
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import kill_job, poll_job, read_job, start_job
from airflow_sky.node.paths import MOUNTS_DIR


def _sleeps(tag: str) -> list[psutil.Process]:
    """This machine's live `sleep <tag>...` processes (each test tags its sleeps with a number of its own)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        ours = len(cmdline) == 2 and cmdline[0] == "sleep" and cmdline[1].startswith(tag)
        if ours and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _tag() -> str:
    return f"{1000 + secrets.randbelow(8000)}.{secrets.randbelow(10**6)}"  # a valid, unique sleep duration


def _bystander(client: NodeClient, seconds: str) -> int:
    """A process on the node that is no job's (started over SSH, detached); its pid as the node sees it."""
    rc, out, err = client.exec(f"setsid sleep {seconds} < /dev/null > /dev/null 2>&1 & echo $!")
    assert rc == 0, err
    return int(out.split()[-1])


def test_a_job_that_names_a_bystander_in_its_pid_file_gets_only_its_own_processes_killed(local_cluster):
    _, nodes, key = local_cluster(1)
    tag = _tag()
    with NodeClient(nodes[0], key) as client:
        other_pid = _bystander(client, f"{tag}1")
        assert start_job(client, "victim", f"sleep {tag}2", {}).started
        _wait(lambda: len(_sleeps(tag)) == 2, "the bystander and the other job's sleep did not start")
        victim_wrapper = poll_job(client, "victim", 0, 0).pid
        # Each job writes another process's pid where its own belongs: a bystander's, the other job's wrapper.
        for liar, pid in (
            ("liar1", str(other_pid)),
            ("liar2", '"$(cat ~/.airflow_sky/jobs/victim/gen-0/pid)"'),
        ):
            script = f'echo {pid} > "$AIRFLOW_SKY_JOB_DIR/gen-0/pid"; echo planted; setsid sleep {tag}3 & sleep {tag}4'
            assert start_job(client, liar, script, {}).started
            _wait(lambda liar=liar: b"planted" in read_job(client, liar, 0, 0).data, "no pid planted")
            _wait(lambda: len(_sleeps(tag)) == 4, "the job's sleeps did not start")
            assert read_job(client, liar, 0, 0).pid in (other_pid, victim_wrapper)
            assert kill_job(client, liar, 0, grace_s=1.0) == 143
            left = sorted(p.info["cmdline"][1] for p in _sleeps(tag))
            assert left == [f"{tag}1", f"{tag}2"], "the cancel killed a bystander, or left a setsid child"
        assert poll_job(client, "victim", 0, 0).running
        assert kill_job(client, "victim", 0, grace_s=1.0) == 143
        client.exec(f"kill {other_pid}")


def test_a_cancel_ends_setsid_and_double_forked_children(local_cluster):
    _, nodes, key = local_cluster(1)
    tag = _tag()
    script = f"setsid sleep {tag}1 & ( setsid sleep {tag}2 & ) ; ( ( sleep {tag}3 & ) & ) ; sleep {tag}4"
    with NodeClient(nodes[0], key) as client:
        assert start_job(client, "forks", script, {}).started
        _wait(lambda: len(_sleeps(tag)) == 4, "the job's sleeps did not start")
        assert kill_job(client, "forks", 0, grace_s=1.0) == 143
        assert _sleeps(tag) == []
        poll = poll_job(client, "forks", 0, 0)
        assert (poll.running, poll.exit_code) == (False, 143)


def test_a_flush_file_a_job_planted_never_runs_in_a_later_job(local_cluster):
    _, nodes, key = local_cluster(1)
    plant = (
        f'mkdir -p ~/{MOUNTS_DIR} && printf "#!/bin/bash\\necho \\$SECRET >> ~/stolen\\n" > ~/{MOUNTS_DIR}/flush '
        f"&& chmod 700 ~/{MOUNTS_DIR}/flush"
    )
    with NodeClient(nodes[0], key) as client:
        assert start_job(client, "planter", plant, {}).started
        _wait(lambda: read_job(client, "planter", 0, 0).exit_code is not None, "the planting job did not end")
        assert client.exec(f"test -x ~/{MOUNTS_DIR}/flush")[0] == 0
        assert start_job(client, "next", "echo next", {"SECRET": "s3cr3t"}).started
        _wait(lambda: read_job(client, "next", 0, 0).exit_code is not None, "the next job did not end")
        assert read_job(client, "next", 0, 0).exit_code == 0
        assert client.exec("test -e ~/stolen")[0] == 1, (
            "a later job ran the flush file an earlier one planted"
        )


@pytest.mark.parametrize("isolated", [True, False], ids=["namespaces", "plain-processes"])
def test_tearing_down_a_local_cluster_ends_what_a_job_left_setsid_double_fork_or_cleared_env(
    local_cluster, monkeypatch, isolated
):
    if isolated and daemon.isolation() is None:
        pytest.skip("no PID namespaces here (needs root or user namespaces)")
    if not isolated:
        # Plain processes: the node server's subreaper tree is all that holds a job with a cleared env.
        monkeypatch.setattr(daemon, "_isolation_probed", True)
        monkeypatch.setattr(daemon, "_isolation", None)
    name, nodes, key = local_cluster(1)
    tag = _tag()
    script = (
        f"setsid sleep {tag}1 < /dev/null > /dev/null 2>&1 & "
        f"( ( sleep {tag}2 < /dev/null > /dev/null 2>&1 & ) & ) ; "
        f"env -i setsid sleep {tag}3 < /dev/null > /dev/null 2>&1 & "
        f"( env -i setsid sh -c 'sleep {tag}4 & exit 0' < /dev/null > /dev/null 2>&1 & ) ; exit 0"
    )
    with NodeClient(nodes[0], key) as client:
        assert start_job(client, "leaver", script, {}).started
        _wait(lambda: read_job(client, "leaver", 0, 0).exit_code is not None, "the job did not end")
    _wait(lambda: len(_sleeps(tag)) == 4, "the job's leftovers did not start")
    from airflow_sky.infra.local.cloud import LocalCloud

    LocalCloud().terminate(name)
    _wait(lambda: _sleeps(tag) == [], f"processes a job left outlived the teardown: {_sleeps(tag)}", 30)
