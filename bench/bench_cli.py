"""How long the everyday CLI commands take: `status`, `queue`, `logs`, `cancel`, `down`, an unknown cluster,
and a one-line `exec` on the kept cluster (to its first output line and to its end).

    baseline  `python -c pass`: the interpreter's own start, which every `airflow-sky` call pays too
              (`true` is shown as well: what a process costs at all)
    ours      `python -m airflow_sky.client.cli COMMAND ...` as a user runs it, each a process of its own, on a
              2-node local cluster with one finished job (launched once before the timing, not timed)

`down` is timed on a 1-node cluster made for each try (`local up`, not timed); the others repeat on the
kept cluster. Each figure is the median of --repeats tries. The target: every command well under a second,
which leaves the interpreter start plus a few hundred milliseconds; the ratio says how many interpreter
starts a command costs. None of them imports Airflow (tests/cli/test_cli_imports.py guards that).

`exec C one-line.yaml` (`run: echo hi`) is timed to its first output line (`hi`) and to its end, next to
`ssh C 'echo hi'` through the CLI's own ssh config (what `airflow-sky ssh C` runs): the floor of any remote
command. Its target (issue 38): the first line within 2 s, the end within 3 s of it.

Usage: python bench/bench_cli.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import header, restored_env  # bench/common.py (the script's own folder)

CLUSTER = "bench-cli"
JOB = """\
name: bench
num_nodes: 2
run: echo "hello from $SKYPILOT_NODE_RANK"
"""
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]


def private_cli_homes(state: Path) -> None:
    """The CLI's Airflow home, index, ssh entries and local clusters under `state` (children inherit it)."""
    os.environ.pop("AIRFLOW_HOME", None)
    os.environ["AIRFLOW_SKY_AIRFLOW_HOME"] = str(state / "airflow")
    os.environ["AIRFLOW_SKY_HOME"] = str(state / "sky-home")
    os.environ["AIRFLOW_SKY_SSH_CONFIG"] = str(state / "ssh_config")
    os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
    for name in [k for k in os.environ if k.startswith("AIRFLOW_CONN_")]:
        del os.environ[name]  # no cloud is configured: an unknown cluster is looked for on local only


def run(argv: list[str], *, ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of `argv`; exits naming the command when its status is
    not one of `ok`. The CPU time is what a busy machine inflates least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def median_of(repeats: int, argv: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    tries = [run(argv, ok=ok) for _ in range(repeats)]
    return statistics.median(t[0] for t in tries), statistics.median(t[1] for t in tries)


def line(label: str, measured: tuple[float, float], baseline: tuple[float, float]) -> str:
    (wall, cpu), (base_wall, base_cpu) = measured, baseline
    return f"  {label:<28} {wall:6.3f} s  ratio {wall / base_wall:5.2f}   cpu {cpu:6.3f} s  ratio {cpu / base_cpu:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    header()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp, restored_env(dict(os.environ)):
        state = Path(tmp)
        private_cli_homes(state)
        task = state / "job.yaml"
        task.write_text(JOB)
        print("launching the cluster and its job (not timed) ...", flush=True)
        run([*CLI, "launch", "-c", CLUSTER, str(task), "-y"])
        try:
            measure(args.repeats)
        finally:
            run([*CLI, "down", CLUSTER, "-y"])


def measure(repeats: int) -> None:
    baseline = median_of(repeats, [sys.executable, "-c", "pass"])
    process = median_of(repeats, ["true"])
    commands: list[tuple[str, list[str], tuple[int, ...]]] = [
        ("status", ["status"], (0,)),
        (f"status {CLUSTER}", ["status", CLUSTER], (0,)),
        (f"queue {CLUSTER}", ["queue", CLUSTER], (0,)),
        (f"logs {CLUSTER} 1", ["logs", CLUSTER, "1"], (0,)),
        (f"logs --status {CLUSTER}", ["logs", "--status", CLUSTER], (0,)),
        (f"cancel {CLUSTER}", ["cancel", CLUSTER], (0,)),
        ("queue nosuch (error)", ["queue", "nosuch"], (1,)),
        ("down nosuch -y (error)", ["down", "nosuch", "-y"], (1,)),
    ]
    print(f"\nmedian of {repeats}, wall and CPU (user + system); ratio = seconds / `python -c pass`'s")
    print(line("true", process, baseline))
    print(line("python -c pass (baseline)", baseline, baseline))
    for label, argv, ok in commands:
        print(line(label, median_of(repeats, [*CLI, *argv], ok), baseline), flush=True)
    downs = []
    for i in range(repeats):
        name = f"bench-down-{i}"
        run([*CLI, "local", "up", name, "--nodes", "1"])
        downs.append(run([*CLI, "down", name, "-y"]))
    down = statistics.median(d[0] for d in downs), statistics.median(d[1] for d in downs)
    print(line("down (1 node)", down, baseline))
    measure_exec(repeats, baseline)


def first_line_and_end(argv: list[str], wanted: str) -> tuple[float, float]:
    """Seconds until `argv` prints a line containing `wanted`, and until it ends (exits non-zero: fail)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    first: float | None = None
    output = []
    for text in proc.stdout:
        output.append(text)
        if first is None and wanted in text:
            first = time.perf_counter() - started
    code = proc.wait(timeout=600)
    end = time.perf_counter() - started
    if code != 0 or first is None:
        sys.exit(
            f"{' '.join(argv)} exited {code} (first line seen: {first is not None}):\n{''.join(output)[-3000:]}"
        )
    return first, end


def measure_exec(repeats: int, baseline: tuple[float, float]) -> None:
    one_line = Path(os.environ["AIRFLOW_SKY_HOME"]).parent / "one-line.yaml"
    one_line.write_text("run: echo hi-from-exec\n")
    ssh = ["ssh", "-F", os.environ["AIRFLOW_SKY_SSH_CONFIG"], CLUSTER, "echo hi-from-exec"]
    runs = {
        "ssh C 'echo' (floor)": [first_line_and_end(ssh, "hi-from-exec") for _ in range(repeats)],
        "exec C 1-line": [
            first_line_and_end([*CLI, "exec", CLUSTER, str(one_line)], "hi-from-exec") for _ in range(repeats)
        ],
    }
    print(
        f"\none-line job on the kept 2-node cluster, median of {repeats} (ratio = seconds / `python -c pass`'s)"
    )
    base = baseline[0]
    for label, tries in runs.items():
        first = statistics.median(t[0] for t in tries)
        end = statistics.median(t[1] for t in tries)
        print(
            f"  {label:<28} first line {first:6.3f} s  ratio {first / base:5.2f}   "
            f"end {end:6.3f} s  ratio {end / base:5.2f}   end - first {end - first:6.3f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
