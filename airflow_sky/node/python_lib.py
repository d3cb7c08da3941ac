"""The Python a job gets on its node: `airflow_sky.progress`, shipped with every start of a script.

Its files travel in the job's tar stream (`jobs.job_files`) to `gen-<g>/lib/airflow_sky/progress/`, and
the wrapper puts `gen-<g>/lib` at the end of the job's PYTHONPATH (`shell.launch_script`). The shipped
`airflow_sky` has no `__init__.py`: it is a namespace portion, so a node where airflow-sky is installed
(a regular package anywhere on sys.path) imports its own, and a node without it imports this copy.
Shipping with each start, rather than once at sync, reaches `exec` jobs and a relaunch's replacement
node the same way, and a job always gets the helper of the airflow-sky that started it.
"""

from __future__ import annotations

import functools
from importlib import resources

LIB_DIR = "lib"  # under the generation dir; the wrapper exports it as AIRFLOW_SKY_PYTHONPATH
_PACKAGE = "airflow_sky.progress"


@functools.cache
def job_python_files() -> dict[str, bytes]:
    """{path in the job's tar: bytes} of every module of airflow_sky.progress (standard library only)."""
    root = resources.files(_PACKAGE)
    prefix = f"{LIB_DIR}/{_PACKAGE.replace('.', '/')}"
    return {
        f"{prefix}/{entry.name}": entry.read_bytes()
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.is_file() and entry.name.endswith(".py")
    }
