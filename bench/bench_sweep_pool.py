"""A sweep of 4 trials x 2 local nodes: on a pool of 2 warm workers vs each trial as a sky_job of its own.

    baseline  sky_sweep without a pool: every trial provisions its own 2-node cluster, runs the setup, runs,
              and tears the cluster down (what N separate sky_jobs do), 2 trials at a time
    ours      sky_sweep on a pool of 2 workers (`airflow-sky jobs pool apply`, timed on its own line: paid
              once per pool, not per sweep), 2 trials at a time (max_parallel=2, as the pool's size)

Both under `airflow dags test` (one task at a time, so both need max_parallel for at most 2 at once), with the
same setup (`sleep 8`: a short pip install) and run (`sleep 3`). Ratio < 1: the pool is faster.
Run: `make bench` (or `.venv/bin/python bench/bench_sweep_pool.py [--trials 4]`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import header, private_homes, restored_env

SETUP = "sleep 8"
RUN = "sleep 3"
POOL = "bench-pool"

POOL_FILE = f"""
pool:
  workers: 2
num_nodes: 2
setup: {SETUP}
"""

SWEEP_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_sweep

task = Task(name="trial", num_nodes=2, {setup}run={run!r})
with DAG({dag_id!r}, schedule=None) as dag:
    sky_sweep(task, params=[{{"LR": str(i)}} for i in range({trials})], max_parallel=2, {pool})
"""


def _timed_run(env: dict[str, str], *command: str) -> float:
    """Seconds `command` took; exits with its output when it fails."""
    started = time.perf_counter()
    proc = subprocess.run(list(command), env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def _airflow(env: dict[str, str], *args: str) -> float:
    return _timed_run(env, str(Path(sys.executable).parent / "airflow"), *args)


def _sky(env: dict[str, str], *args: str) -> float:
    return _timed_run(env, sys.executable, "-m", "airflow_sky.client.cli", *args)


def main() -> None:
    parser = argparse.ArgumentParser(description="a sweep on a pool vs its trials as sky_jobs of their own")
    parser.add_argument("--trials", type=int, default=4)
    trials = parser.parse_args().trials
    header()
    with (
        tempfile.TemporaryDirectory(prefix="airflow-sky-bench-sweep-") as state,
        restored_env(dict(os.environ)),
    ):
        root = Path(state)
        private_homes(root)
        dags = root / "airflow" / "dags"
        dags.mkdir(parents=True)
        os.environ.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
        env = dict(os.environ)
        _airflow(env, "db", "migrate")
        (dags / "baseline.py").write_text(
            textwrap.dedent(
                SWEEP_DAG.format(
                    setup=f"setup={SETUP!r}, ", run=RUN, dag_id="baseline", trials=trials, pool=""
                )
            )
        )
        (dags / "ours.py").write_text(
            textwrap.dedent(
                SWEEP_DAG.format(setup="", run=RUN, dag_id="ours", trials=trials, pool=f"pool={POOL!r}")
            )
        )
        (root / "pool.yaml").write_text(POOL_FILE)
        baseline = _airflow(env, "dags", "test", "baseline")
        apply = _sky(env, "jobs", "pool", "apply", "-p", POOL, str(root / "pool.yaml"), "-y")
        try:
            ours = _airflow(env, "dags", "test", "ours")
        finally:
            _sky(env, "jobs", "pool", "down", POOL, "-y")
        name = f"sweep of {trials} trials x 2 nodes, 2 at a time"
        print(f"{name:<40} pool {ours:7.1f}s   own clusters {baseline:7.1f}s   ratio {ours / baseline:5.2f}")
        print(
            f"{'  the pool apply (once per pool)':<40} {apply:7.1f}s   pool+apply ratio {(ours + apply) / baseline:5.2f}"
        )


if __name__ == "__main__":
    main()
