"""sky's everyday cluster forms through the real CLI on real local clusters (issue 38, item 3): `status -r`,
`status --ip`, the AUTOSTOP column, `queue` with no cluster and `-s`, `cancel -a/-y` (and its question on a
terminal), `down`/`stop` with glob patterns and `-a`; tables at 80 and 200 columns (item 4)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.client.cli.tables import NAME_MIN
from airflow_sky.infra.local.cloud import LocalCloud
from tests.cli import test_jobs_cli

# The CLI in a private sky home for this module (the `env` fixture), as the kept-cluster tests run it.
CLI, cli, env = test_jobs_cli.CLI, test_jobs_cli.cli, test_jobs_cli.env

CLUSTER = "forms-a"
LONG = "pretrain-gpt2-medium-on-openwebtext-with-a-long-descriptive-run-name"
QUEUE_HEADERS = {"ID", "NAME", "SUBMITTED", "DURATION", "NODES", "PROGRESS", "ETA", "STATUS", "FAILED"}


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """forms-a: 2 nodes with autostop armed (-i 10); job 1 SUCCEEDED, job 2 FAILED, job 3 (a long name)
    RUNNING."""
    folder = tmp_path_factory.mktemp("forms")
    (folder / "ok.yaml").write_text("name: ok\nnum_nodes: 2\nrun: echo ok\n")
    (folder / "fails.yaml").write_text("name: fails\nrun: exit 7\n")
    (folder / "long.yaml").write_text(f"name: {LONG}\nnum_nodes: 2\nrun: sleep 3600\n")
    launched = cli(env, "launch", "-c", CLUSTER, str(folder / "ok.yaml"), "-y", "-i", "10")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert cli(env, "exec", CLUSTER, str(folder / "fails.yaml")).returncode == 1
    detached = cli(env, "exec", CLUSTER, str(folder / "long.yaml"), "-d")
    assert detached.returncode == 0, detached.stdout + detached.stderr
    yield CLUSTER
    cli(env, "down", "-a", "-y")


def _lines_fit(out: str, width: int) -> None:
    assert max(len(line) for line in out.splitlines()) <= width, out


def _tables(out: str) -> dict[str, list[dict[str, str]]]:
    """Each `Job queue of C` table of `queue`'s output: its rows as {header: cell}."""
    tables: dict[str, list[dict[str, str]]] = {}
    current: list[dict[str, str]] = []
    header: list[str] = []
    for line in out.splitlines():
        if line.strip().startswith("Job queue of "):
            current = tables.setdefault(line.strip().removeprefix("Job queue of ").split(":")[0], [])
            header = []
        elif line.startswith(("┃", "│")):
            cells = [c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]
            if not header:
                header = cells
            else:
                current.append(dict(zip(header, cells, strict=True)))
    return tables


def _local(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> LocalCloud:
    """The module's local infra, read from this process."""
    monkeypatch.setenv("AIRFLOW_SKY_HOME", env["AIRFLOW_SKY_HOME"])
    return LocalCloud()


def test_status_shows_the_armed_autostop_and_the_head_ip_and_fits_80_and_200(env, cluster, monkeypatch):
    for width in ("80", "200"):
        out = cli({**env, "COLUMNS": width}, "status").stdout
        _lines_fit(out, int(width))
        row = next(line for line in out.splitlines() if CLUSTER in line)
        assert "UP" in row and ("10m" in row or width == "80"), out
    wide = cli({**env, "COLUMNS": "200"}, "status").stdout
    assert "AUTOSTOP" in wide and "10m" in next(line for line in wide.splitlines() if CLUSTER in line)
    ip = cli(env, "status", "--ip", CLUSTER)
    assert ip.returncode == 0, ip.stderr
    assert ip.stdout == _local(env, monkeypatch).nodes(CLUSTER)[0].ssh_host + "\n"
    for argv, message in (
        (["status", "--ip"], "status --ip: name exactly one cluster"),
        (["status", "--ip", "-r", CLUSTER], "--refresh cannot be combined with --ip"),
        (["status", "--ip", "forms-nowhere"], "forms-nowhere"),
    ):
        refused = cli(env, *argv)
        assert refused.returncode != 0 and message in refused.stderr, (argv, refused.stderr)
        assert "Traceback" not in refused.stderr and refused.stdout == ""


def test_queue_without_a_cluster_lists_every_cluster_and_skip_finished_keeps_the_running_job(env, cluster):
    up = cli(env, "local", "up", "forms-b", "--nodes", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    for width in (80, 200):
        out = cli({**env, "COLUMNS": str(width)}, "queue")
        assert out.returncode == 0, out.stderr
        _lines_fit(out.stdout, width)
        assert "Job queue of forms-b: no jobs." in out.stdout, out.stdout
        rows = _tables(out.stdout)[CLUSTER]
        assert [r["ID"] for r in rows] == ["3", "2", "1"], out.stdout
        assert [r["STATUS"] for r in rows] == ["RUNNING", "FAILED", "SUCCEEDED"], out.stdout
        assert set(rows[0]) <= QUEUE_HEADERS and {"ID", "NAME", "STATUS"} <= set(rows[0]), out.stdout
        name = rows[0]["NAME"]
        assert len(name) >= NAME_MIN and LONG.startswith(name.rstrip("…")), out.stdout
        assert (name == LONG) == (width == 200), out.stdout
        if width == 200:
            assert rows[1]["FAILED"] == "rank 0: exit 7", out.stdout
    running = cli(env, "queue", "-s")
    assert running.returncode == 0, running.stderr
    assert [r["ID"] for r in _tables(running.stdout)[CLUSTER]] == ["3"], running.stdout
    assert "Job queue of forms-b: no unfinished jobs." in running.stdout
    named = cli(env, "queue", CLUSTER, "-s")
    assert list(_tables(named.stdout)) == [CLUSTER], named.stdout


def _status_row(env: dict[str, str], name: str) -> str:
    out = cli({**env, "COLUMNS": "200"}, "status", name).stdout
    return next(line for line in out.splitlines() if f"│ {name} " in line)


def _on_a_terminal(environ: dict[str, str], answer: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a terminal as its stdin, `answer` typed into it."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*CLI, *argv],
            env=environ,
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(leader, answer.encode())
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(follower)
        os.close(leader)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_cancel_asks_on_a_terminal_and_all_with_yes_cancels_every_unfinished_job(env, cluster):
    kept = _on_a_terminal(env, "n\n", "cancel", CLUSTER, "-a")
    assert (
        kept.returncode == 1
        and "Cancelling every unfinished job on cluster forms-a. Proceed? [Y/n]" in kept.stdout
    )
    assert "Aborted." in kept.stdout
    assert [r["ID"] for r in _tables(cli(env, "queue", CLUSTER, "-s").stdout)[CLUSTER]] == ["3"]
    cancelled = cli(env, "cancel", CLUSTER, "-a", "-y")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == "Cancelled job(s) 3 on forms-a.\n"
    assert "Job queue of forms-a: no unfinished jobs." in cli(env, "queue", CLUSTER, "-s").stdout
    again = cli(env, "cancel", CLUSTER, "--all", "--yes")
    assert again.stdout == "No unfinished job to cancel.\n"


def test_status_refresh_asks_the_infras_and_forgets_a_cluster_none_has(env, cluster):
    index = Path(env["AIRFLOW_SKY_HOME"]) / "clusters.json"
    recorded = json.loads(index.read_text())
    index.write_text(json.dumps({**recorded, "forms-ghost": "local"}))
    refreshed = cli({**env, "COLUMNS": "200"}, "status", "-r")
    assert refreshed.returncode == 0, refreshed.stderr
    assert CLUSTER in refreshed.stdout and "forms-b" in refreshed.stdout
    assert "forms-ghost" not in refreshed.stdout
    assert "forms-ghost" not in json.loads(index.read_text())
    assert json.loads(index.read_text()).get(CLUSTER) == "local"


def test_down_and_stop_take_glob_patterns_and_all(env, cluster, monkeypatch):
    local = _local(env, monkeypatch)
    for name in ("forms-g1", "forms-g2"):
        up = cli(env, "local", "up", name, "--nodes", "1")
        assert up.returncode == 0, up.stdout + up.stderr
    nothing = cli(env, "down", "forms-nowhere*", "-y")
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr
    assert nothing.stderr.startswith("airflow-sky: error: down: no cluster matches 'forms-nowhere*'")
    assert len(nothing.stderr.splitlines()) == 1 and "forms-g1" in nothing.stderr
    armed = cli(env, "autostop", "forms-g1", "-i", "30", "--down")
    assert armed.returncode == 0, armed.stdout + armed.stderr
    assert "30m (down)" in _status_row(env, "forms-g1")
    # (Nodes no job ran on: they stop too.)
    stopped = cli(env, "stop", "forms-g*", "-y", timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "Cluster forms-g1 stopped." in stopped.stdout and "Cluster forms-g2 stopped." in stopped.stdout
    assert "STOPPED" in _status_row(env, "forms-g2") and "30m" not in _status_row(env, "forms-g1")
    again = cli(env, "stop", "forms-g2", "-y")  # as sky: said, not done again, and not an error
    assert again.returncode == 0 and again.stdout == "Cluster forms-g2 is already stopped.\n", again.stdout
    # A started cluster's nodes run no watcher until armed again: its AUTOSTOP says so.
    started = cli(env, "start", "forms-g1")
    assert started.returncode == 0, started.stdout + started.stderr
    row = _status_row(env, "forms-g1")
    assert "UP" in row and "30m" not in row and "│ -" in row, row
    downed = cli(env, "down", "forms-g?", "-y")
    assert downed.returncode == 0, downed.stdout + downed.stderr
    assert downed.stdout.splitlines() == ["Cluster forms-g1 terminated.", "Cluster forms-g2 terminated."]
    assert sorted(local.clusters()) == [CLUSTER, "forms-b"]
    every = cli(env, "down", "-a", "-y")
    assert every.returncode == 0, every.stdout + every.stderr
    assert every.stdout.splitlines() == ["Cluster forms-a terminated.", "Cluster forms-b terminated."]
    assert local.clusters() == []
    assert cli(env, "down", "-a", "-y").stdout == "No clusters (see `airflow-sky status`).\n"
    bare = cli(env, "stop")
    assert bare.returncode == 2 and "-a/--all" in bare.stderr
