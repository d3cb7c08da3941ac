"""What every benchmark script shares: the machine line, the header, private homes and env restore, a local
cluster's teardown, timing, running an operator."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def machine(extra: str = "") -> str:
    """CPUs and their model, Python, the OS; `extra` appended (tool versions)."""
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = (
        f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()} ({platform.platform(terse=True)})"
    )
    return f"{text}; {extra}" if extra else text


def header(extra: str = "") -> None:
    """The command line, the machine, the date and which airflow_sky is measured."""
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine(extra)}")
    print(f"date:    {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    import airflow_sky

    print(f"package: {Path(airflow_sky.__file__).parent}", flush=True)


@contextlib.contextmanager
def restored_env(saved: dict[str, str]) -> Iterator[None]:
    """os.environ as `saved` again on the way out (the temp dirs set here die with this benchmark)."""
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def private_homes(state: Path) -> None:
    """Airflow's and airflow-sky's state under `state`, never the user's ~/airflow or ~/.airflow_sky (child
    processes inherit it); the tasks' info lines stay out of the output. Undo with restored_env."""
    os.environ["AIRFLOW_HOME"] = str(state / "airflow")
    os.environ["AIRFLOW_SKY_HOME"] = str(state / "sky-home")
    os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"


def terminate_local(cloud: Any, name: str) -> None:
    """Terminate the benchmark's local cluster; warn about any node process left behind."""
    cloud.terminate(name)
    from airflow_sky.infra.local import daemon

    left = daemon.processes_with_marker(name)
    if left:
        print(f"WARNING: {len(left)} node processes left behind: {[p.pid for p in left]}")


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of `fn()`."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run_task(op: Any) -> Any:
    """`op.execute` as Airflow's task runner calls it (the sentinel satisfies its ExecutorSafeguard)."""
    from airflow.sdk.bases.operator import ExecutorSafeguard

    return op.execute({}, **{f"{type(op).__name__}__sentinel": ExecutorSafeguard.sentinel_value})
