"""What every benchmark script shares: the machine line, the header, env restore, running an operator."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
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


def run_task(op: Any) -> Any:
    """`op.execute` as Airflow's task runner calls it (the sentinel satisfies its ExecutorSafeguard)."""
    from airflow.sdk.bases.operator import ExecutorSafeguard

    return op.execute({}, **{f"{type(op).__name__}__sentinel": ExecutorSafeguard.sentinel_value})
