"""report(): what a training loop calls. Thread-safe, rate-limited, never raising, importing nothing heavy."""

from __future__ import annotations

import ast
import io
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

import airflow_sky.progress as progress
from airflow_sky.progress import MAX_METRICS, Report, Reporter, parse_line
from airflow_sky.progress.reporter import interval_from_env, rank_from_env

PACKAGE_DIR = Path(progress.__file__).parent


class Clock:
    """A monotonic clock the test moves by hand: the rate limit is proven without sleeping."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reports(stream: io.StringIO) -> list[Report]:
    lines = stream.getvalue().splitlines()
    parsed = [parse_line(line) for line in lines]
    assert None not in parsed, lines
    return [r for r in parsed if r is not None]


def test_a_report_is_one_line_the_parser_reads_back_with_rank_and_time(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    out = io.StringIO()
    assert Reporter(min_interval_s=0, stream=out).report(7, 10, loss=0.25, **{"tokens/s": 1200})
    (report,) = _reports(out)
    assert (report.step, report.total, dict(report.metrics), report.rank) == (
        7,
        10,
        {"loss": 0.25, "tokens/s": 1200.0},
        3,
    )
    assert report.time is not None and report.time > 1.7e9
    assert out.getvalue().count("\n") == 1


def test_rank_comes_from_torchrun_else_the_node_rank() -> None:
    assert rank_from_env({"RANK": "5", "SKYPILOT_NODE_RANK": "1"}) == 5
    assert rank_from_env({"SKYPILOT_NODE_RANK": "1"}) == 1
    assert rank_from_env({"RANK": "x"}) is None


def test_the_rate_limit_holds_reports_and_never_loses_a_metric_or_its_step() -> None:
    clock, out = Clock(), io.StringIO()
    reporter = Reporter(min_interval_s=1.0, stream=out, rank=0, clock=clock)
    assert reporter.report(1, 100, loss=4.0)  # the first is written at once
    clock.now += 0.3
    assert not reporter.report(2, 100, loss=3.9)  # held
    clock.now += 0.3
    assert not reporter.report(3, 100, lr=0.1)  # replaces it, and keeps its loss
    assert not reporter.due()
    assert [r.step for r in _reports(out)] == [1]
    clock.now += 0.5
    assert reporter.due()
    # Due: a step alone does not replace the held metrics; they are written with their own step.
    assert not reporter.report(4, 100)
    written = _reports(out)
    assert [(r.step, dict(r.metrics)) for r in written] == [(1, {"loss": 4.0}), (3, {"loss": 3.9, "lr": 0.1})]
    clock.now += 0.1
    assert not reporter.report(5, 100)
    assert reporter.flush() and not reporter.flush()  # the held report, once
    clock.now += 0.1
    assert not reporter.report(6, 100, loss=1.0)
    assert not reporter.report(7, 100)  # held metrics are kept
    assert reporter.report(100, 100)  # reaching total writes at once: the held metrics first
    assert [(r.step, dict(r.metrics)) for r in _reports(out)][2:] == [(5, {}), (6, {"loss": 1.0}), (100, {})]


def test_a_report_held_at_exit_is_written_at_exit() -> None:
    code = (
        "from airflow_sky.progress import report\n"
        "report(step=1, total=10, loss=0.5)\n"
        "report(step=2, total=10, loss=0.4)\n"  # within the default second: held until exit
        "print('training done', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_SKY_PROGRESS_INTERVAL_S"}  # the default
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lines = done.stdout.splitlines()
    assert [(r.step, dict(r.metrics)) for r in map(parse_line, lines) if r is not None] == [
        (1, {"loss": 0.5}),
        (2, {"loss": 0.4}),
    ]
    assert lines.index("training done") == 1, lines  # the second line came at exit


def test_invalid_values_are_dropped_with_one_warning_each_and_never_raise() -> None:
    out = io.StringIO()
    reporter = Reporter(min_interval_s=0, stream=out, rank=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(50):  # a loop repeating a mistake warns once per mistake
            reporter.report(1, 10, loss=float("nan"), acc=0.5, name_ok=float("inf"), **{"bad name": 1.0})
            reporter.report(-1, 10, loss=1.0)
            reporter.report("x", 10)  # type: ignore[arg-type]
            reporter.report(2, 0, loss=1.0)
            reporter.report(3, 10, text="1", flag=True, big=10**400, obj=object())  # type: ignore[arg-type]
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 9, messages
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]  # the caller's line
    assert any("'loss' must be a finite number, not nan" in m for m in messages)
    assert any("'bad name' is not allowed" in m for m in messages)
    assert any("step must be an integer >= 0, not -1" in m for m in messages)
    assert any("total must be an integer >= 1, not 0" in m for m in messages)
    reports = _reports(out)
    assert {r.step for r in reports} == {1, 2, 3}
    assert all(dict(r.metrics) in ({"acc": 0.5}, {"loss": 1.0}, {}) for r in reports)
    assert all(r.total is None for r in reports if r.step == 2)


def test_numbers_of_numpy_and_torch_kinds_are_metrics() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    out = io.StringIO()
    with pytest.warns(RuntimeWarning, match="'c' must be a finite number"):  # not one number
        Reporter(min_interval_s=0, stream=out, rank=0).report(
            np.int64(4), np.int64(8), a=np.float32(0.5), b=torch.tensor(2.0), c=torch.tensor([1.0, 2.0])
        )
    (report,) = _reports(out)
    assert (report.step, report.total, dict(report.metrics)) == (4, 8, {"a": 0.5, "b": 2.0})


def test_only_the_first_32_metrics_are_kept() -> None:
    out = io.StringIO()
    with pytest.warns(RuntimeWarning, match="at most 32 metrics"):
        Reporter(min_interval_s=0, stream=out).report(1, **{f"m{i}": i for i in range(40)})
    assert len(_reports(out)[0].metrics) == MAX_METRICS


class Broken(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError("disk full")


def test_a_broken_stream_and_warnings_as_errors_never_reach_the_training_loop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under `python -W error`
        reporter = Reporter(min_interval_s=0, stream=Broken())
        assert reporter.report(1, 10, loss=1.0) is False
        assert reporter.report(2, 10, loss=float("nan")) is False
        assert Reporter(min_interval_s=0, stream=io.StringIO()).report(-5) is False


def test_many_threads_reporting_at_once_write_whole_lines_only() -> None:
    out = io.StringIO()
    reporter = Reporter(min_interval_s=0, stream=out, rank=0)
    start = threading.Barrier(8)

    def loop(thread: int) -> None:
        start.wait()
        for step in range(500):
            reporter.report(step, 500, thread=thread, loss=step / 500)

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reports = _reports(out)
    assert len(reports) == 8 * 500
    for thread in range(8):
        steps = [r.step for r in reports if r.metrics["thread"] == thread]
        assert steps == list(range(500))  # each thread's reports whole and in order


def test_the_interval_comes_from_the_environment() -> None:
    assert interval_from_env({}) == 1.0
    assert interval_from_env({"AIRFLOW_SKY_PROGRESS_INTERVAL_S": "0"}) == 0.0
    assert interval_from_env({"AIRFLOW_SKY_PROGRESS_INTERVAL_S": " 2.5 "}) == 2.5
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.warns(RuntimeWarning, match="AIRFLOW_SKY_PROGRESS_INTERVAL_S"):
            assert interval_from_env({"AIRFLOW_SKY_PROGRESS_INTERVAL_S": bad}) == 1.0


def test_configure_replaces_the_reporter_behind_report() -> None:
    out = io.StringIO()
    try:
        progress.configure(min_interval_s=0, stream=out, rank=9)
        assert progress.report(step=1, total=2, loss=1.0) and progress.report(step=2, total=2)
        assert [(r.step, r.rank) for r in _reports(out)] == [(1, 9), (2, 9)]
    finally:
        progress.configure(stream=None)


def test_importing_it_pulls_in_no_airflow_ssh_or_third_party_module() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import airflow_sky.progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "airflow_sky.progress" in imported
    heavy = {
        m
        for m in imported
        if m.split(".")[0]
        in {"airflow", "paramiko", "asyncssh", "yaml", "pendulum", "sqlalchemy", "torch", "numpy"}
    }
    assert heavy == set(), heavy
    ours = {m for m in imported if m.startswith("airflow_sky")}
    assert ours <= {
        "airflow_sky",
        "airflow_sky.errors",
        "airflow_sky.progress",
        "airflow_sky.progress.protocol",
        "airflow_sky.progress.reporter",
    }, ours


def test_every_module_of_the_package_imports_only_the_standard_library_and_itself() -> None:
    # What a node without airflow-sky gets (node.python_lib ships the whole package): at import, nothing
    # else may be needed; the callbacks import their frameworks inside functions.
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert (
                    name.startswith("airflow_sky.progress")
                    or top == "__future__"
                    or top in sys.stdlib_module_names
                ), f"{path.name} imports {name}"


def test_a_child_forked_while_another_thread_reports_can_report(tmp_path: Path) -> None:
    # A DataLoader worker is forked from a process whose other threads may hold the reporter's lock then.
    out = tmp_path / "child.log"
    reporter = Reporter(min_interval_s=0, stream=io.StringIO(), rank=0)
    holding, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with reporter._lock:
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert holding.wait(60)
    pid = os.fork()
    if pid == 0:  # the child: the lock's holder does not exist here
        with open(out, "w") as stream:
            reporter._stream = stream
            reporter.report(1, 2, loss=0.5)
        os._exit(0)
    release.set()
    holder.join()
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child deadlocked on the reporter's lock")
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    assert parse_line(out.read_text()) == Report(1, 2, {"loss": 0.5}, 0, parse_line(out.read_text()).time)
