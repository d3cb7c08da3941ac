"""Fuzz: a few thousand mutated copies of the suite's SkyPilot example task files (seeded, so every run feeds
the same files) through `check` (the function the CLI runs, and a handful through the real CLI) and through
dags_from_folder. Each ends in a normalized task or one SpecError line, never another exception, within two
seconds of CPU (garbage collection paused while it is measured); in a DAG folder each becomes a DAG or that file's `broken` DAG, never an unforeseen error.

CPU time of the checking thread, not wall time: the bound holds on a loaded machine (the process's CPU
time does not: under xdist it counts execnet's I/O thread too, which pushed one file past 1 s in CI; a
collection of the worker's whole heap, run inside one file's check, did the same). A file that loops is stopped by a CPU-time alarm (SIGPROF) and reported by name."""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import random
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_sky.client.cli import build_parser
from airflow_sky.client.cli.check import run as check
from airflow_sky.errors import SkyError

EXAMPLES = Path(__file__).parent / "skypilot_examples"
SEED_FILES = sorted(EXAMPLES.rglob("*.yaml"))
CHECKED = 2000  # mutants through check, in-process
FOLDERS = 200  # mutants through dags_from_folder, one folder each (some with a mutated sidecar)
CPU_LIMIT_S = 2.0  # the slowest file takes ~0.1 s on an idle machine: a pathological parse takes far more
RunCli = Callable[..., subprocess.CompletedProcess[str]]

SIDECAR = b'dag_id: fuzzed\nschedule: "@daily"\nstart_date: "2026-01-01"\nretries: 2\ntags: [a, b]\n'

# What a hostile or careless edit puts into a YAML file: structure, aliases, tags, odd scalars, bytes.
SNIPPETS = [
    b"[",
    b"]",
    b"{",
    b"}",
    b": ",
    b"- ",
    b"? ",
    b"&a ",
    b"*a",
    b"<<: *a",
    b"!!set ",
    b"!!binary ",
    b"!!int ",
    b"!!python/object:os.system ",
    b"!!timestamp ",
    b"|",
    b">-",
    b"'",
    b'"',
    b"#",
    b"\t",
    b"---\n",
    b"...\n",
    b"%YAML 1.1\n",
    b"\\",
    b"${",
    b"$HOME",
    b"..",
    b"../../",
    b"~/",
    b"null",
    b"~",
    b"true",
    b"0x",
    b".inf",
    b"1e999",
    b"2024-13-45",
    b"9" * 5000,
    b"\xff",
    b"\xc3",
    b"\x00",
    b"\r",
    b"\xef\xbb\xbf",
    b"[" * 200,
    b"{a: " * 100,
    b"? [a, b]\n: 1\n",
    b"{[a]: 1}",
    b"&a [1, *a]",
    b"- &x [1, 2]\n- [*x, *x, *x, *x]\n",
]


def _mutate(text: bytes, rng: random.Random) -> bytes:
    """One to three edits: lines dropped, doubled, swapped or re-indented, snippets inserted or put in a
    value's place, bytes flipped, the file cut short."""
    for _ in range(rng.randint(1, 3)):
        lines = text.split(b"\n")
        kind = rng.randrange(8)
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        if kind == 0:
            del lines[i]
        elif kind == 1:
            lines.insert(i, lines[j])
        elif kind == 2:
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == 3:
            lines[i] = b" " * rng.choice([1, 2, 4]) + lines[i] if rng.random() < 0.5 else lines[i].lstrip()
        elif kind == 4:
            at = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:at] + rng.choice(SNIPPETS) + lines[i][at:]
        elif kind == 5 and b": " in lines[i]:
            key = lines[i].split(b": ", 1)[0]
            lines[i] = key + b": " + rng.choice(SNIPPETS)
        elif kind == 6 and text:
            data = bytearray(text)
            data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        elif kind == 7:
            return text[: rng.randint(0, len(text))]
        text = b"\n".join(lines)
    return text


def _mutants(count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    seeds = [(path.relative_to(EXAMPLES), path.read_bytes()) for path in SEED_FILES]
    for n in range(count):
        name, text = rng.choice(seeds)
        yield f"{n:04d}-{str(name).replace('/', '_')}", _mutate(text, rng)


class _CpuTimeout(Exception):
    pass


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Garbage collection paused: a full collection of the test worker's heap is not the parse's CPU."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def _cpu_deadline(seconds: float) -> Iterator[None]:
    """Raise _CpuTimeout once the process has used `seconds` more CPU (a loop, not a slow machine)."""

    def expire(_signum: int, _frame: object) -> None:
        raise _CpuTimeout

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _check_in_process(path: Path) -> tuple[str, str]:
    """`airflow-sky check FILE` as the CLI runs it: ("ok" or the error line, stderr)."""
    args: argparse.Namespace = build_parser().parse_args(["check", str(path)])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            check(args)
        except SkyError as e:
            return str(e), err.getvalue()
    return "ok", err.getvalue()


def test_mutated_example_task_files_end_in_a_task_or_one_spec_error_line(tmp_path: Path) -> None:
    assert len(SEED_FILES) >= 30, "the SkyPilot examples moved"
    slowest = (0.0, "")
    outcomes: dict[str, int] = {"ok": 0, "error": 0}
    for name, content in _mutants(CHECKED, seed=27):
        path = tmp_path / f"{name}"
        path.write_bytes(content)
        started = time.thread_time()
        try:
            with _cpu_deadline(5 * CPU_LIMIT_S), _no_gc():
                result, _ = _check_in_process(path)
        except _CpuTimeout:
            pytest.fail(f"{name}: still running after {5 * CPU_LIMIT_S} s of CPU:\n{content[:2000]!r}")
        except Exception as e:
            pytest.fail(f"{name}: {type(e).__name__}: {e}\n{content[:2000]!r}")
        cpu = time.thread_time() - started
        slowest = max(slowest, (cpu, name))
        assert cpu < CPU_LIMIT_S, f"{name}: {cpu:.2f} s of CPU"
        if result == "ok":
            outcomes["ok"] += 1
        else:
            outcomes["error"] += 1
            assert "\n" not in result and result.startswith(str(path)), (name, result)
        path.unlink()
    # The mutations keep enough files valid that check's whole path (normalize, print) runs too.
    assert outcomes["ok"] > CHECKED // 20 and outcomes["error"] > CHECKED // 4, outcomes
    print(f"check: {outcomes}; slowest {slowest[1]}: {slowest[0]:.3f} s of CPU")


def test_mutated_task_files_in_a_dag_folder_each_become_a_dag_or_their_own_broken_dag(tmp_path: Path) -> None:
    from airflow_sky.dags.folder import SkyFolderWarning, dags_from_folder

    warm = tmp_path / "warm-up"  # the first call imports Airflow and the operators: not the file's cost
    warm.mkdir()
    (warm / "t.yaml").write_text("run: echo hi\n")
    dags_from_folder(warm)
    rng = random.Random(2027)
    broken = 0
    for name, content in _mutants(FOLDERS, seed=2026):
        folder = tmp_path / name
        folder.mkdir()
        task = folder / "task.yaml"
        task.write_bytes(content)
        if rng.random() < 0.3:
            (folder / "task.dag.yaml").write_bytes(_mutate(SIDECAR, rng))
        started = time.thread_time()
        try:
            with _cpu_deadline(5 * CPU_LIMIT_S), _no_gc(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dags = dags_from_folder(folder)
        except _CpuTimeout:
            pytest.fail(f"{name}: still running after {5 * CPU_LIMIT_S} s of CPU:\n{content[:2000]!r}")
        except Exception as e:
            pytest.fail(f"{name}: dags_from_folder raised {type(e).__name__}: {e}\n{content[:2000]!r}")
        cpu = time.thread_time() - started
        assert cpu < CPU_LIMIT_S, f"{name}: {cpu:.2f} s of CPU"
        assert len(dags) == 1, (name, dags)
        (dag,) = dags.values()
        if "broken" in dag.tags:
            broken += 1
            folder_warnings = [w for w in caught if issubclass(w.category, SkyFolderWarning)]
            assert len(folder_warnings) == 1 and folder_warnings[0].filename == str(task), name
            # Every failure is one a check foresaw (file, field, rule), not the catch-all for the unforeseen.
            assert "cannot become a DAG:" not in dag.description, (name, dag.description)
            assert dag.description.startswith(f"broken task file: {folder}/"), (name, dag.description)
    assert FOLDERS // 10 < broken < FOLDERS, broken


def test_a_handful_of_mutants_through_the_real_cli(run_cli: RunCli, tmp_path: Path) -> None:
    for name, content in list(_mutants(5, seed=99)):
        path = tmp_path / f"{name}"
        path.write_bytes(content)
        result = run_cli("check", str(path))
        assert result.returncode in (0, 2), (name, result.stderr)
        assert "Traceback" not in result.stderr, (name, result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("airflow-sky: error:")]
        assert len(errors) == (1 if result.returncode == 2 else 0), (name, result.stderr)
