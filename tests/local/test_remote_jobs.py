"""Detached jobs on real local nodes: survive disconnects, tail exactly once, kill whole trees, keep env intact."""

from __future__ import annotations

import json
import signal
import time

from airflow_sky.infra.local import daemon
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import job_files, kill_job, poll_job, read_xcom, start_job
from airflow_sky.node.shell import start_command


def _wait_done(
    client: NodeClient, job_id: str, generation: int = 0, timeout: float = 60
) -> tuple[bytes, int | None]:
    data, offset = b"", 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll = poll_job(client, job_id, generation, offset, max_bytes=4096)
        data += poll.data
        offset = poll.next_offset
        if not poll.running and poll.caught_up:
            return data, poll.exit_code
        if poll.caught_up:
            time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish within {timeout}s")


def test_detached_job_survives_the_client_disconnecting(local_cluster):
    _, nodes, key = local_cluster(1)
    client = NodeClient(nodes[0], key)
    start = start_job(client, "survivor", "sleep 1.5; echo still here", {})
    assert start.started and start.pid
    client.close()  # drops the SSH connection while the job sleeps
    with NodeClient(nodes[0], key) as again:
        assert poll_job(again, "survivor", 0, 0).running
        assert _wait_done(again, "survivor") == (b"still here\n", 0)


def test_start_is_idempotent_per_job_and_generation(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        first = start_job(client, "once", "echo ran >> ~/count; sleep 1", {})
        second = start_job(client, "once", "echo ran >> ~/count; sleep 1", {})
        assert first.started and not second.started and first.pid == second.pid
        _wait_done(client, "once")
        assert client.exec("cat ~/count")[1] == b"ran\n"
        relaunch = start_job(client, "once", "echo ran >> ~/count", {}, generation=1)
        assert relaunch.started
        _wait_done(client, "once", generation=1)
        assert client.exec("cat ~/count")[1] == b"ran\nran\n"


def test_tailing_by_offset_returns_every_byte_exactly_once(local_cluster):
    _, nodes, key = local_cluster(1)
    script = "for i in $(seq 1 3000); do printf 'line %05d %s\\n' $i $(head -c $((i % 50)) /dev/zero | tr '\\0' x); done"
    expected = "".join(f"line {i:05d} {'x' * (i % 50)}\n" for i in range(1, 3001)).encode()
    with NodeClient(nodes[0], key) as client:
        start_job(client, "tail", script, {})
        data, code = _wait_done(client, "tail")
    assert code == 0
    assert data == expected


def test_kill_stops_the_whole_process_tree(local_cluster):
    name, nodes, key = local_cluster(1)
    script = "bash -c 'sleep 301 & sleep 302; wait' & sleep 303; wait"
    with NodeClient(nodes[0], key) as client:
        start_job(client, "tree", script, {})
        time.sleep(0.5)
        sleeps = [p for p in daemon.processes_with_marker(name) if p.name() == "sleep"]
        assert len(sleeps) == 3
        assert kill_job(client, "tree", 0, sig=signal.SIGTERM, grace_s=2) == 143
        poll = poll_job(client, "tree", 0, 0)
    assert not poll.running and poll.exit_code == 143
    assert [p for p in daemon.processes_with_marker(name) if p.is_running() and p.name() == "sleep"] == []


def test_sigkill_records_the_requested_exit_code(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        start_job(client, "stubborn", "trap '' TERM; sleep 300", {})
        time.sleep(0.3)
        assert kill_job(client, "stubborn", 0, sig=signal.SIGKILL, grace_s=1, record_exit_code=137) == 137
        assert poll_job(client, "stubborn", 0, 0).exit_code == 137


def test_env_values_arrive_intact(local_cluster):
    _, nodes, key = local_cluster(1)
    env = {
        "QUOTES": 'it\'s "quoted" `not run`',
        "DOLLAR": "$HOME ${PATH} $(whoami)",
        "SPACES": "  a  b  ",
        "NEWLINES": "line1\nline2\n\nline4",
        "UNICODE": "naïve café 日本語 🚀",
        "EMPTY": "",
    }
    script = (
        'python3 -c "import json, os; '
        "keys = ['QUOTES', 'DOLLAR', 'SPACES', 'NEWLINES', 'UNICODE', 'EMPTY']; "
        "json.dump({k: os.environ[k] for k in keys}, open(os.environ['AIRFLOW_SKY_XCOM_DIR'] + '/return.json', 'w'))\""
    )
    with NodeClient(nodes[0], key) as client:
        start_job(client, "envcheck", script, env)
        _, code = _wait_done(client, "envcheck")
        assert code == 0
        assert json.loads(read_xcom(client, "envcheck") or b"null") == env
        # The env file (secrets at rest) is gone once the job read it; its dir was private all along.
        assert client.exec("test -e ~/.airflow_sky/jobs/envcheck/gen-0/env")[0] == 1
        assert client.exec("stat -c %a ~/.airflow_sky/jobs/envcheck/gen-0")[1].strip() == b"700"


def test_ended_job_dirs_beyond_the_kept_number_are_removed_when_a_job_starts(local_cluster, monkeypatch):
    monkeypatch.setattr("airflow_sky.node.shell.KEPT_JOB_DIRS", 3)
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        start_job(client, "long", "sleep 30", {})
        for n in range(5):
            start_job(client, f"short{n}", "true", {})
            _wait_done(client, f"short{n}")
        kept = client.exec("ls -1 ~/.airflow_sky/jobs")[1].decode().split()
        # The running job stays whatever its age; of the ended ones only the newest survive.
        assert "long" in kept and "short4" in kept and "short0" not in kept and len(kept) <= 4
        kill_job(client, "long", 0)


def test_a_job_that_does_not_exist_reports_missing(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        poll = poll_job(client, "nope", 0, 0)
    assert poll.missing and not poll.running and not poll.lost


def test_a_start_cut_off_while_unpacking_is_retried_by_the_next_attempt_and_the_job_runs(local_cluster):
    # A session that drops mid-upload: the stream ends inside a file's data (tar fails), or inside the next
    # file's header (which tar takes for the archive's end, and exits 0).
    _, nodes, key = local_cluster(1)
    files = job_files("echo ran >> ~/count; echo done", {"A": "1"})
    with NodeClient(nodes[0], key) as client:
        for cut in (1540, 1280):
            rc, _, err = client.exec(start_command("cut", 0), stdin=files[:cut], timeout=60)
            assert rc != 0, err
            # Nothing was claimed and nothing of the attempt is left: the generation is not there at all.
            assert poll_job(client, "cut", 0, 0).missing
            assert client.exec("ls -A ~/.airflow_sky/jobs/cut")[1] == b""
        start = start_job(client, "cut", "echo ran >> ~/count; echo done", {"A": "1"})
        assert start.started and start.pid
        assert _wait_done(client, "cut") == (b"done\n", 0)
        assert client.exec("cat ~/count")[1] == b"ran\n"


def test_a_half_done_start_left_by_a_dead_session_is_cleaned_and_never_adopted(local_cluster):
    # What a killed attempt can leave: its staging dir (its shell gone), and a generation dir with files but
    # no claim (as an older version wrote it before unpacking).
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        left = (
            "mkdir -p ~/.airflow_sky/jobs/half/.stage-0-999999 ~/.airflow_sky/jobs/half/gen-0 && "
            "echo partial > ~/.airflow_sky/jobs/half/gen-0/script.sh"
        )
        assert client.exec(left)[0] == 0
        start = start_job(client, "half", "echo whole", {})
        assert start.started and start.pid
        assert _wait_done(client, "half") == (b"whole\n", 0)
        assert client.exec("ls -A ~/.airflow_sky/jobs/half")[1].split() == [b"gen-0", b"xcom"]
        assert not start_job(client, "half", "echo again", {}).started  # claimed now: a retry attaches
