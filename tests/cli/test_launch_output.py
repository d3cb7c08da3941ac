"""What `airflow-sky launch` prints, in order: a phase's banner after the last line of the phase before it,
a verdict after the failing rank's own last line; and what a launch leaves behind (nothing).

Real launches on the local infra (2 nodes), through the CLI as a user runs it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from airflow_sky.client.cli.progress import ProgressPrinter
from airflow_sky.client.events import Event
from airflow_sky.client.live import LogOrder, drains_logs_first, ends_the_logs
from airflow_sky.infra.local import layout
from tests.cli.test_launch_cli import _cli, cli_env  # noqa: F401 (a fixture)

# Each phase ends with a line printed after a quiet pause: the node-log thread has backed off to its
# slowest poll by then, and the runner (which polls faster) moves on before that thread reads the line.
# Without the drains, the verdict came before "last words of rank 1" in about every other run.
LAST_WORDS = """\
name: last-words
num_nodes: 2
setup: |
  for i in $(seq 1 40); do echo "setup line $i"; done
  sleep 4
  echo "setup ends on rank $SKYPILOT_SETUP_NODE_RANK"
run: |
  if [ "$SKYPILOT_NODE_RANK" = 1 ]; then
    for i in $(seq 1 40); do echo "run line $i"; done
    sleep 4
    echo "last words of rank 1"
    exit 4
  fi
  sleep 600
"""

TOO_MANY_GPUS = """\
name: too-many-gpus
num_nodes: 2
resources:
  accelerators: L4:1000
run: echo never
"""


def _index(lines: list[str], text: str) -> int:
    found = [i for i, line in enumerate(lines) if text in line]
    assert found, f"{text!r} not printed"
    return found[0]


def _launch_folders(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["AIRFLOW_SKY_AIRFLOW_HOME"]) / "dags").glob("launch-*"))


def test_banners_and_verdicts_come_after_the_log_lines_that_led_to_them(
    cli_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    (tmp_path / "last.yaml").write_text(LAST_WORDS)
    result = _cli(cli_env, "launch", "-c", "cli-order", str(tmp_path / "last.yaml"), "--down", "-y")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    launching = _index(lines, "⚙ Launching the run")
    assert _index(lines, "setup ends on rank 0") < launching, out
    assert _index(lines, "setup ends on rank 1") < launching, out
    last_words = _index(lines, "last words of rank 1")
    verdicts = [i for i, line in enumerate(lines) if line.startswith("✗")]
    assert verdicts and min(verdicts) > last_words, out
    assert any("rank 1 failed with exit code 4" in lines[i] for i in verdicts), out
    assert _index(lines, "⚙ Tearing down") > last_words
    assert _index(lines, "run exit codes: rank 0: ") > _index(lines, "⚙ Tearing down")
    assert _launch_folders(cli_env) == [], "the launch left its dags folder behind"


def test_a_failed_provision_leaves_no_node_dir_home_or_dags_folder(
    cli_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    (tmp_path / "gpus.yaml").write_text(TOO_MANY_GPUS)
    homes = layout.homes_root()
    before = set(os.listdir(homes))
    result = _cli(cli_env, "launch", "-c", "cli-nogpu", str(tmp_path / "gpus.yaml"), "--down", "-y")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "accelerators:" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not layout.cluster_dir("cli-nogpu").exists()
    assert set(os.listdir(homes)) <= before, "a node home or its .tmp outlived the failed provision"
    assert _launch_folders(cli_env) == []


def test_only_a_steps_first_start_and_the_verdicts_wait_for_the_logs() -> None:
    order = LogOrder()
    assert order.drain_before(Event("task_started", "launch"))
    assert not order.drain_before(Event("task_started", "launch"))  # a second mapped instance
    assert order.drain_before(Event("task_failed", "run_follow", 0, "killed: rank 1 failed"))
    assert order.drain_before(Event("exit", "run_follow", 1, "rank 1 failed", exit_code=4))
    assert order.drain_before(Event("exit", "run_follow", 1, "lost", exit_code=None))
    assert not order.drain_before(Event("exit", "run_follow", 0, exit_code=0))
    # Events the node-log thread itself tells never wait on it.
    assert not drains_logs_first(Event("log", "run_follow", 0, "a line"), first_start=False)
    assert not drains_logs_first(Event("relaunch", "run_follow", None, "recovering"), first_start=False)


def test_the_node_logs_are_read_for_the_last_time_when_the_teardown_starts() -> None:
    # An ssh pool host is freed only once no session of its user is left: a log reader must be gone by then.
    assert ends_the_logs(Event("task_started", "teardown"))
    assert not ends_the_logs(Event("task_started", "collect"))
    assert not ends_the_logs(Event("task_failed", "teardown", None, "failed"))


def test_the_cause_the_killed_ranks_share_is_printed_once_per_generation() -> None:
    # At 32 nodes a fail-fast printed 31 identical "✗ killed: rank 7 failed ..." lines.
    console = Console(file=io.StringIO(), width=200)
    printer = ProgressPrinter(console)
    killed = "killed: rank 7 failed with exit code 5"
    try:
        printer(Event("exit", "run_follow", 7, "rank 7 failed with exit code 5", exit_code=5))
        for rank in range(7):
            printer(Event("exit", "run_follow", rank, killed, exit_code=137))
        printer(
            Event("relaunch", "run_follow", None, "node of rank 3 lost; relaunching the job as generation 1")
        )
        printer(Event("exit", "run_follow", 0, killed, exit_code=137))
    finally:
        printer.close()
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert sum(killed in line for line in lines) == 2, lines  # once, and once after the relaunch
    assert sum("✗ rank 7 failed with exit code 5" in line for line in lines) == 1, lines
