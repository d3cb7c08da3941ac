"""The CLI's `sky` habits and first-user papercuts that need no cluster: tables, names, flags, messages."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from airflow_sky.client import sdk
from airflow_sky.client.cli import EXIT_BROKEN_PIPE, main
from airflow_sky.client.cli.common import load_task
from airflow_sky.client.cli.progress import ProgressPrinter, job_status_of, print_summary
from airflow_sky.client.engine import JobOutcome
from airflow_sky.client.events import Event
from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.gang.log_files import last_lines_offset as _last_lines_offset
from airflow_sky.gang.recovery import Action, RecoveryState, decide
from airflow_sky.infra.base import Node, NodeStatus
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.node.logs import node_prefix
from airflow_sky.task import JobRecovery, Task

NOW = 1_800_000_000.0


def _records() -> list[dict[str, Any]]:
    return [
        {
            "job_id": 1,
            "name": "a-rather-long-job-name-that-a-user-might-well-choose-for-a-training-run",
            "submitted_at": NOW - 7200,
            "started_at": NOW - 7100,
            "ended_at": NOW - 3000,
            "num_nodes": 16,
            "status": "SUCCEEDED",
        },
        {
            "job_id": 2,
            "name": "train",
            "submitted_at": NOW - 90,
            "started_at": NOW - 80,
            "ended_at": NOW - 20,
            "num_nodes": 2,
            "status": "FAILED",
            "failed_rank": 1,
            "failed_exit_code": 4,
        },
        {
            "job_id": 3,
            "name": "prep",
            "submitted_at": NOW - 5,
            "num_nodes": 2,
            "status": "FAILED_SETUP",
            "failed_rank": 0,
            "failed_exit_code": 1,
        },
    ]


def _cli_output(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", "80")
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_queue_fits_80_columns_and_names_the_failed_rank_and_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(sdk, "queue", lambda cluster: _records())
    monkeypatch.setattr("airflow_sky.client.cli.cluster_jobs.time.time", lambda: NOW)
    rc, out, _ = _cli_output(monkeypatch, capsys, "queue", "dev")
    assert rc == 0
    assert max(len(line) for line in out.splitlines()) <= 80, out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "FAILED" in rows["2"] and "rank 1: exit 4" in rows["2"] and "1 min ago" in rows["2"]
    assert "FAILED_SE" in rows["3"] and "rank 0: exit 1" in rows["3"]
    assert "2 hrs ago" in rows["1"] and "1h 8m" in rows["1"] and "SUCCEEDED" in rows["1"]


def test_status_fits_80_columns(monkeypatch, capsys):
    nodes = [{"internal_ip": "10.128.0.123"}] * 3
    clusters = [
        {"name": f"cluster-with-a-long-name-for-the-nightly-run-{i}", "status": "UP", "nodes": nodes}
        for i in range(3)
    ]
    monkeypatch.setattr(sdk, "status", lambda names, infra: clusters)
    rc, out, _ = _cli_output(monkeypatch, capsys, "status")
    assert rc == 0 and "UP" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out


def test_a_cluster_name_that_would_be_changed_is_refused_naming_the_pattern(monkeypatch, capsys, tmp_path):
    (tmp_path / "one.yaml").write_text("name: one\nrun: echo one\n")
    rc, _, err = _cli_output(
        monkeypatch, capsys, "launch", "-c", "bad name!", str(tmp_path / "one.yaml"), "-y"
    )
    assert rc == 2
    assert "cluster name 'bad name!' is invalid" in err and "[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?" in err
    assert "'bad-name'" in err  # the name it would have become, as a suggestion
    with pytest.raises(SpecError, match="bad name!"):
        sdk.launch(Task(run="echo"), cluster_name="bad name!")
    assert sdk.check_cluster_name("dev-2") == "dev-2"
    # A name SkyPilot accepts but that is no host name label is used as one, and the CLI says so.
    assert sdk.check_cluster_name("Dev_Box.1") == "dev-box-1"
    assert sdk.cluster_name_note("Dev_Box.1") == (
        "cluster 'Dev_Box.1' is named 'dev-box-1' here (cluster names are host name labels: lowercase "
        "letters, digits and '-', at most 40 characters)"
    )


def test_task_with_a_misspelled_argument_is_a_spec_error_with_a_did_you_mean():
    with pytest.raises(SpecError, match=r"did you mean 'num_nodes'\?"):
        Task(num_node=2)  # type: ignore[call-arg]
    assert Task(name="ok", num_nodes=2, run="echo").num_nodes == 2


def _args(file: Path, **extra: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "file": str(file),
        "env": [],
        "env_file": None,
        "secret": [],
        "secret_file": None,
    }
    values.update(extra)
    return SimpleNamespace(**values)


def test_bare_env_and_secret_keys_come_from_the_local_environment(monkeypatch, tmp_path):
    task_file = tmp_path / "t.yaml"
    task_file.write_text("name: t\nenvs:\n  MODE: yaml\nsecrets:\n  HF_TOKEN: null\nrun: echo\n")
    secret_file = tmp_path / "secrets.env"
    secret_file.write_text("WANDB_KEY=from-the-file\n")
    monkeypatch.setenv("MODE", "from-shell")
    monkeypatch.setenv("HF_TOKEN", "hf-s3cr3t")
    task = load_task(
        _args(task_file, env=["MODE"], secret=["HF_TOKEN", "DB_PASS=pw"], secret_file=str(secret_file))
    )
    assert task.envs == {"MODE": "from-shell"}
    assert task.secrets == {"HF_TOKEN": "hf-s3cr3t", "DB_PASS": "pw", "WANDB_KEY": "from-the-file"}
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(SpecError) as missing:
        load_task(_args(task_file, secret=["HF_TOKEN"]))
    assert "HF_TOKEN is not set in the local environment" in str(missing.value)
    with pytest.raises(SpecError) as bad:
        load_task(_args(task_file, secret=["9BAD=very-secret-value"]))
    assert "very-secret-value" not in str(bad.value)  # an error names the key, never a value


def test_recovery_messages_have_balanced_parentheses_and_no_unknown_pid():
    policy = JobRecovery()
    for ranks in ([1], [0, 2]):
        decision = decide(ranks, None, policy, RecoveryState())
        assert decision.action is Action.RECOVER
        message = f"the job is relaunched ({decision.action.value}: {decision.reason})"
        assert message.count("(") == message.count(")") == 1, message
    assert decide([1], None, policy, RecoveryState()).reason == "node of rank 1 lost"
    assert decide([0, 2], None, policy, RecoveryState()).reason == "nodes of ranks 0, 2 lost"
    assert node_prefix(1, None, "10.0.0.7") == "(worker1, rank=1, ip=10.0.0.7)"
    assert node_prefix(1, 42, "10.0.0.7") == "(worker1, rank=1, pid=42, ip=10.0.0.7)"


def _print(events: list[Event], **options: bool) -> str:
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=100), **options)
    for event in events:
        printer(event)
    printer.close()
    return out.getvalue()


def test_progress_names_provisioning_and_teardown_only_when_they_happen():
    steps = [
        Event("task_started", step) for step in ("provision", "sync", "launch", "run_follow", "teardown")
    ]
    launched_down = _print(steps, down=True, new_nodes=True)
    assert "Provisioning nodes" in launched_down and "Tearing down" in launched_down
    kept = _print(steps, down=False, new_nodes=True)
    assert "Provisioning nodes" in kept and "Tearing down" not in kept
    executed = _print(steps, down=False, new_nodes=False)
    assert (
        "Provisioning" not in executed and "Tearing down" not in executed and "Launching the run" in executed
    )
    # A phase's header comes before its first node line (node logs are read from the task that starts it).
    setup = _print(
        [Event("task_started", "sync"), Event("log", "setup_follow", 0, "(setup head, rank=0) hi")]
    )
    assert setup.index("then running setup") < setup.index("(setup head, rank=0) hi")
    no_setup = _print([Event("task_started", "sync")], setup=False)
    assert "Syncing workdir and file mounts" in no_setup and "setup" not in no_setup


def _outcome(**fields: Any) -> JobOutcome:
    values: dict[str, Any] = {
        "succeeded": False,
        "state": "failed",
        "cluster_name": "dev",
        "job_id": 3,
        "log_file": Path("/tmp/launch.log"),
        "step_times": {},
        "exit_codes": {"setup": {}, "run": {}},
        "failures": ["rank 1 failed with exit code 2; killed the processes on the other nodes"],
    }
    values.update(fields)
    return JobOutcome(**values)


def test_final_line_names_the_status_as_queue_shows_it():
    setup_failed = _outcome(exit_codes={"setup": {0: 137, 1: 2}, "run": {}})
    assert job_status_of(setup_failed) == "FAILED_SETUP"
    assert job_status_of(_outcome(exit_codes={"setup": {0: 0}, "run": {0: 3}})) == "FAILED"
    assert job_status_of(_outcome(failures=["cancelled (airflow-sky cancel)"])) == "CANCELLED"
    assert job_status_of(_outcome(succeeded=True, state="success", failures=[])) == "SUCCEEDED"
    out = io.StringIO()
    print_summary(Console(file=out, width=200), setup_failed, 0.0)
    assert "✗ Job 3 on dev FAILED_SETUP: rank 1 failed with exit code 2" in out.getvalue()


class _FakeLogClient:
    """What jobs.read_job asks of a node: the exit code file, the log's bytes from an offset, the pid."""

    def __init__(self, log: bytes) -> None:
        self.log = log

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes | None:
        return b"0\n" if path.endswith("exit_code") else None

    def read_range(self, path: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return self.log[offset : offset + max_bytes] if max_bytes > 0 else b"", len(self.log)


def test_tail_starts_at_the_last_n_lines():
    log = b"".join(b"line %d\n" % i for i in range(50_000))
    client: Any = _FakeLogClient(log)
    for n in (1, 3, 20_000):
        offset = _last_lines_offset(client, "1-run", 0, n)
        assert log[offset:].count(b"\n") == n and log[offset:].startswith(b"line %d\n" % (50_000 - n))
    assert _last_lines_offset(client, "1-run", 0, 0) == 0
    assert _last_lines_offset(client, "1-run", 0, 60_000) == 0
    unfinished: Any = _FakeLogClient(b"a\nb\nc")  # a last line still being written counts as one
    assert _last_lines_offset(unfinished, "1-run", 0, 1) == 4


def test_stop_on_an_infra_that_cannot_stop_nodes_names_it(monkeypatch):
    node = Node(0, "10.0.0.5", "10.0.0.5", 22, "me", "lab-0", status=NodeStatus.RUNNING)
    cluster = SimpleNamespace(
        name="lab-job", infra="ssh/lab", cloud=SshCloud.__new__(SshCloud), nodes=lambda: [node]
    )
    monkeypatch.setattr(sdk, "cluster_of", lambda name, infra=None: cluster)
    with pytest.raises(ClusterError) as refused:
        sdk.stop("lab-job")
    message = str(refused.value)
    assert "cannot stop cluster 'lab-job': the ssh/lab infra cannot stop its nodes" in message
    assert "airflow-sky down lab-job" in message


def test_down_stop_autostop_accept_sky_flags(monkeypatch, capsys):
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(sdk, "down", lambda name, log=print: calls.append(("down", name)))
    monkeypatch.setattr(
        sdk, "autostop", lambda name, minutes, down=False: calls.append(("autostop", minutes, down))
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: nothing is asked
    assert main(["down", "a", "b", "-y"]) == 0
    assert main(["down", "c"]) == 0
    assert main(["autostop", "a", "-i", "10", "--down"]) == 0
    assert main(["autostop", "a", "--cancel"]) == 0
    assert calls == [
        ("down", "a"),
        ("down", "b"),
        ("down", "c"),
        ("autostop", 10, True),
        ("autostop", None, False),
    ]
    out = capsys.readouterr().out
    assert "Cluster a terminated." in out and "its nodes end themselves after 10 idle minutes" in out
    # On a terminal, down asks first (as sky does); anything but y/yes keeps the cluster.
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: True))
    questions: list[str] = []
    monkeypatch.setattr("builtins.input", lambda question: questions.append(question) or "n")
    assert main(["down", "keep-me"]) == 1
    assert ("down", "keep-me") not in calls and "Terminating cluster(s) keep-me" in questions[0]
    assert main(["down", "keep-me", "--yes"]) == 0 and calls[-1] == ("down", "keep-me")


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch, capsys):
    def broken(args: Any) -> int:
        raise BrokenPipeError

    monkeypatch.setattr("airflow_sky.client.cli.cluster_jobs._queue", broken)
    monkeypatch.setattr("airflow_sky.client.cli.silence_stdout", lambda: EXIT_BROKEN_PIPE)
    assert main(["queue", "dev"]) == EXIT_BROKEN_PIPE
    # Node log lines printed from threads (as `logs` does) into a reader that went away: no traceback.
    script = textwrap.dedent(
        """
        import sys, threading
        from airflow_sky.client.cli import PipeSafeOutput
        out = PipeSafeOutput(sys.stdout)
        def spam(rank):
            for i in range(200000):
                print(f"(worker{rank}) line {i}", file=out, flush=True)
        threads = [threading.Thread(target=spam, args=(r,)) for r in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        """
    )
    assert _read_one_line_and_close(script) == (EXIT_BROKEN_PIPE, b"")
    # launch/exec: the output is dropped and the command goes on to its end (the job is not cut short).
    dropping = script.replace("PipeSafeOutput(sys.stdout)", "PipeSafeOutput(sys.stdout, exit=False)")
    dropping += "print('went on to the end', file=sys.stderr)\n"
    assert _read_one_line_and_close(dropping) == (0, b"went on to the end\n")


def _read_one_line_and_close(script: str) -> tuple[int, bytes]:
    """Run `script`, read one line of its stdout and close it (`| head -1`); its exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err
