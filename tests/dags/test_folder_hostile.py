"""dags_from_folder with hostile files: each bad task file or sidecar becomes that one file's `broken` DAG and
warning, naming the file; every other DAG of the folder loads, and the DAG file itself has no import error.
Proved with a real DagBag and the real `airflow dags list --local` / `airflow dags list-import-errors`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

from tests.dags.conftest import AIRFLOW
from tests.task.test_hostile_input import HOSTILE_FILES

GOOD = {"alpha": "name: alpha\nrun: echo a\n", "omega": "name: omega\nrun: echo z\n"}
BAD_SIDECARS = {
    "late": ("start_date: not-a-date\n", "late.dag.yaml: start_date: must be a date or a date and time"),
    "period": ("start_date: P1D\n", "period.dag.yaml: start_date: must be a date"),
    "cron": ("schedule: not a cron\n", "cron.dag.yaml: Airflow refuses these DAG settings"),
    "twin": ("dag_id: alpha\n", "twin.dag.yaml: dag_id: 'alpha' is already the id of another DAG"),
    "listy": ("? [a]\n: 1\n", "listy.dag.yaml: line 1, column 3: <root>: a mapping key must be"),
}


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, text in GOOD.items():
        (tasks / f"{name}.yaml").write_text(text)
    for name, (content, _) in HOSTILE_FILES.items():
        (tasks / f"{name}.yaml").write_bytes(content)
    for name, (sidecar, _) in BAD_SIDECARS.items():
        (tasks / f"{name}.yaml").write_text(f"name: {name}\nrun: echo {name}\n")
        (tasks / f"{name}.dag.yaml").write_text(sidecar)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "from_folder.py").write_text(
        f"from airflow_sky import dags_from_folder\n\ndags_from_folder({str(tasks)!r})\n"
    )
    return tasks, dags


def test_each_hostile_file_is_its_own_broken_dag_and_the_others_load(tmp_path: Path) -> None:
    tasks, dags = _folder(tmp_path)

    bag = DagBag(dag_folder=str(dags))

    assert bag.import_errors == {}
    for name in GOOD:
        assert "broken" not in bag.dags[name].tags
    warned = {w for ws in bag.captured_warnings.values() for w in ws}
    expected = {name: (f"{tasks / name}.yaml: ", text) for name, (_, text) in HOSTILE_FILES.items()}
    expected |= {name: (f"{tasks}/", text) for name, (_, text) in BAD_SIDECARS.items()}
    for name, (file, message) in expected.items():
        dag = bag.dags[name]  # the twin asked for `alpha`'s id: its stand-in has its file's own
        assert "broken" in dag.tags, name
        assert f"broken task file: {file}" in dag.description and message in dag.description, name
        assert list(dag.task_dict) == ["spec_error"]
        assert any(file in w and message in w for w in warned), (name, warned)
    assert bag.dags["alpha"].get_task("alpha.provision").sky_task.name == "alpha"
    assert set(bag.dags) == set(GOOD) | set(HOSTILE_FILES) | set(BAD_SIDECARS)


def test_airflow_lists_the_folders_dags_and_no_import_error(
    tmp_path: Path, airflow_home: dict[str, str]
) -> None:
    tasks, dags = _folder(tmp_path)
    env = {**airflow_home, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}

    listed = subprocess.run(
        [AIRFLOW, "dags", "list", "--local", "-o", "json", "--columns", "dag_id,description"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = subprocess.run(
        [AIRFLOW, "dags", "list-import-errors", "--local", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert listed.returncode == 0, listed.stderr[-3000:]
    described = {row["dag_id"]: row["description"] for row in _json_rows(listed.stdout)}
    assert set(described) == set(GOOD) | set(HOSTILE_FILES) | set(BAD_SIDECARS)
    assert described["alpha"] is None
    assert described["billion_laughs"] == (
        f"broken task file: {tasks / 'billion_laughs.yaml'}: line 7, column 10: "
        + HOSTILE_FILES["billion_laughs"][1]
    )
    assert "Traceback" not in listed.stdout + listed.stderr
    assert errors.returncode == 0, errors.stderr[-3000:]
    assert _json_rows(errors.stdout) == []


def _json_rows(stdout: str) -> list[dict[str, object]]:
    """The command's JSON output: its last line that is a JSON list (Airflow logs to stdout too)."""
    rows: list[dict[str, object]] = json.loads(
        next(line for line in reversed(stdout.splitlines()) if line.startswith("["))
    )
    return rows
