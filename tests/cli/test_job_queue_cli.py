"""The cluster's job queue through the real CLI on a real 2-node local cluster: jobs that bind one fixed port
on each of their nodes (as torchrun's --master_port does) run one after another, the later ones PENDING
meanwhile; a cancelled pending job never runs. Also `logs`/`cancel` answers for bad job ids and clusters."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import test_jobs_cli
from tests.ports import free_port

# The CLI in a private sky home for this module (the `env` fixture), as the kept-cluster tests run it.
CLI, cli, env = test_jobs_cli.CLI, test_jobs_cli.cli, test_jobs_cli.env

CLUSTER = "queue-c"

# Binds PORT on this node's own address (each local node has its own loopback IP, so two ranks of one job
# never meet; two jobs on one node do), then holds it until $RELEASE exists (or for HOLD_S seconds).
PORT_JOB = """\
name: {name}
num_nodes: 2
run: |
  IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")
  python3 - "$IP" <<'EOF'
  import os, socket, sys, time
  s = socket.socket()
  s.bind((sys.argv[1], int(os.environ["PORT"])))
  s.listen()
  print("bound on", os.environ["SKYPILOT_NODE_RANK"], flush=True)
  release = os.environ.get("RELEASE")
  deadline = time.monotonic() + float(os.environ.get("HOLD_S", "600"))
  while time.monotonic() < deadline and not (release and os.path.exists(release)):
      time.sleep(0.2)
  print("released on", os.environ["SKYPILOT_NODE_RANK"], flush=True)
  EOF
"""


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from kept_cluster(env, tmp_path_factory.mktemp("up"), CLUSTER)


def kept_cluster(env: dict[str, str], folder: Path, name: str, job: str = "up") -> Iterator[str]:
    """A 2-node cluster launched with job 1 (`job`, which echoes), kept for the module, then taken down."""
    task = folder / "up.yaml"
    task.write_text(f"name: {job}\nnum_nodes: 2\nrun: echo up\n")
    launched = cli(env, "launch", "-c", name, str(task), "-y")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    yield name
    cli(env, "down", name, "-y")


def port_job(folder: Path, name: str) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(PORT_JOB.format(name=name))
    return str(path)


def queue_rows(env: dict[str, str], cluster: str) -> dict[str, str]:
    out = cli(env, "queue", cluster).stdout
    return {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}


class Reader:
    """A CLI process whose output is read as it comes (a thread), so the test can wait for a line."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in self.lines if text in line), None)
            if found is not None:
                return found
            if self.proc.poll() is not None and not self._thread.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never came:\n{self.output}")

    def finish(self, timeout: float = 600) -> int:
        self.proc.wait(timeout)
        self._thread.join(30)
        return int(self.proc.returncode)

    @property
    def output(self) -> str:
        return "".join(self.lines)


def test_execs_that_need_the_same_fixed_port_run_one_after_another_and_a_cancelled_pending_job_never_runs(
    env, cluster, tmp_path
):
    release = tmp_path / "release"
    job_env = {**env, "PORT": str(free_port())}
    # As the issue's `launch -d` then `exec`: nothing follows the first job; the waiters look at its nodes.
    first = cli(
        job_env,
        "exec",
        "-d",
        cluster,
        port_job(tmp_path, "first"),
        "--env",
        "PORT",
        "--env",
        f"RELEASE={release}",
    )
    assert first.returncode == 0 and " started on " in first.stdout, first.stdout + first.stderr
    first_id = first.stdout.split("Job ", 1)[1].split()[0]
    try:
        # A second exec in the foreground waits, saying for whom.
        second = Reader(
            job_env, "exec", cluster, port_job(tmp_path, "second"), "--env", "PORT", "--env", "HOLD_S=2"
        )
        waiting = second.wait_for("is PENDING, waiting for job")
        assert f"waiting for job {first_id} to free nodes 0-1" in waiting, waiting
        second_id = waiting.split("Job ", 1)[1].split()[0]
        # `exec -d` returns once queued, behind the second; a second -d job is cancelled while pending.
        third = cli(
            job_env, "exec", "-d", cluster, port_job(tmp_path, "third"), "--env", "PORT", "--env", "HOLD_S=2"
        )
        assert third.returncode == 0 and "queued (PENDING" in third.stdout, third.stdout + third.stderr
        third_id = third.stdout.split("Job ", 1)[1].split()[0]
        doomed = cli(
            job_env, "exec", "-d", cluster, port_job(tmp_path, "doomed"), "--env", "PORT", "--env", "HOLD_S=2"
        )
        assert doomed.returncode == 0 and "queued (PENDING" in doomed.stdout, doomed.stdout + doomed.stderr
        doomed_id = doomed.stdout.split("Job ", 1)[1].split()[0]
        rows = queue_rows(env, cluster)
        assert "RUNNING" in rows[first_id], rows
        assert all("PENDING" in rows[j] for j in (second_id, third_id, doomed_id)), rows
        cancelled = cli(env, "cancel", cluster, doomed_id)
        assert cancelled.returncode == 0 and f"Cancelled job(s) {doomed_id}" in cancelled.stdout, (
            cancelled.stderr
        )
    finally:
        release.touch()
    assert second.finish() == 0, second.output
    assert "bound on 0" in second.output and "bound on 1" in second.output
    followed = cli(env, "logs", cluster, third_id, timeout=600)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "bound on 0" in followed.stdout and "bound on 1" in followed.stdout
    assert followed.stdout.rstrip().splitlines()[-1] == f"✓ Job {third_id} on {cluster} SUCCEEDED"
    rows = queue_rows(env, cluster)
    assert all("SUCCEEDED" in rows[j] for j in (first_id, second_id, third_id)), rows  # each bound its port
    assert "CANCELLED" in rows[doomed_id], rows
    never = cli(env, "logs", "--no-follow", cluster, doomed_id)
    assert "bound on" not in never.stdout, never.stdout
    # --no-follow prints the head's lines before worker1's, whichever node answered first.
    lines = cli(env, "logs", "--no-follow", cluster, first_id).stdout.splitlines()
    head = [i for i, line in enumerate(lines) if line.startswith("(head")]
    worker = [i for i, line in enumerate(lines) if line.startswith("(worker1")]
    assert head and worker and max(head) < min(worker), lines


def test_a_followed_failed_job_ends_with_the_status_line_as_launch_does(env, cluster, tmp_path):
    task = tmp_path / "fails.yaml"
    task.write_text("name: fails\nnum_nodes: 2\nrun: exit $((SKYPILOT_NODE_RANK * 4))\n")
    ran = cli(env, "exec", "-d", cluster, str(task))
    job_id = ran.stdout.split("Job ", 1)[1].split()[0]
    followed = cli(env, "logs", cluster, job_id)
    assert followed.returncode == 1
    assert followed.stdout.rstrip().splitlines()[-1] == (
        f"✗ Job {job_id} on {cluster} FAILED: rank 1 failed with exit code 4"
    ), followed.stdout


@pytest.mark.parametrize(
    "args", [["logs", CLUSTER, "-1"], ["logs", "--status", CLUSTER, "0"], ["cancel", CLUSTER, "-1"]]
)
def test_a_job_id_that_is_not_positive_is_one_line_and_exit_2(env, args):
    result = cli(env, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"airflow-sky: error: job id: must be a positive integer (see `airflow-sky queue {CLUSTER}`), "
        f"got {args[-1]}"
    ]


def test_cancel_on_a_cluster_that_does_not_exist_says_so(env):
    result = cli(env, "cancel", "nosuchcluster", "1")
    assert result.returncode == 1
    # Said by the cluster search (no infra knows the name) or the infra (it has no such cluster).
    assert any(
        f"cluster 'nosuchcluster' {said}" in result.stderr for said in ("not found", "does not exist")
    ), result.stderr
    assert "has no job" not in result.stderr
