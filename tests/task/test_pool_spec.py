"""Pool files and pool jobs (task.pool), SkyPilot's rules: a pool file has `pool: {workers: N}` and no run;
a job for a pool has a run and no setup, workdir or file mounts. SkyPilot's own pool examples pass `check`
without a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from airflow_sky.client.cli import main
from airflow_sky.errors import SpecError
from airflow_sky.task import Task
from airflow_sky.task.pool import (
    check_pool_job,
    check_pool_name,
    job_rank_envs,
    parse_pool,
    pool_task,
    pool_task_record,
    worker_setup_task,
)

EXAMPLES = Path(__file__).parent / "skypilot_pool_examples" / "examples"
POOL_FILES = sorted(EXAMPLES.rglob("*pool.yaml"))
JOB_FILES = sorted(p for p in EXAMPLES.rglob("*.yaml") if p not in POOL_FILES)


def test_there_are_three_pool_files_and_their_three_jobs() -> None:
    assert len(POOL_FILES) == 3 and len(JOB_FILES) == 3


@pytest.mark.parametrize("path", POOL_FILES, ids=[p.parent.name for p in POOL_FILES])
def test_skypilot_pool_file_is_a_pool_and_check_gives_no_warning(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an inert-field warning on `pool` fails here
        task = Task.from_yaml(path, allow_unset=True)
    _, spec = pool_task(task, str(path))
    assert spec.workers in (2, 3)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    assert main(["check", str(path)]) == 0
    _, err = capsys.readouterr()
    assert "warning" not in err and "parsed but not acted on" not in err, err
    assert (
        f"a pool file ({spec.workers} worker(s) of 1 node(s)): create it with `airflow-sky jobs pool apply"
        in err
    )


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.parent.name for p in JOB_FILES])
def test_skypilot_pool_job_file_is_a_job_a_pool_takes(path: Path) -> None:
    check_pool_job(Task.from_yaml(path, allow_unset=True), str(path))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "pool: must be a mapping, e.g. {workers: 2}"),
        ({}, "pool.workers: required, a whole number from 1 to 256, got None"),
        ({"workers": 0}, "pool.workers: required, a whole number from 1 to 256, got 0"),
        ({"workers": True}, "pool.workers: required, a whole number from 1 to 256, got True"),
        ({"workers": 2, "min_workers": 1}, "pool: unknown field 'min_workers'; a pool here has a fixed size"),
    ],
)
def test_a_bad_pool_section_names_the_field(value: object, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("{", r"\{").replace("}", r"\}")):
        parse_pool(value)


def test_a_bad_pool_section_in_a_file_fails_at_load_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("pool:\n  workers: -1\nsetup: echo hi\n")
    with pytest.raises(SpecError, match=rf"^{path}: pool.workers: required"):
        Task.from_yaml(path)


def test_a_pool_file_may_not_run_anything_and_a_task_without_pool_is_no_pool_file() -> None:
    with pytest.raises(SpecError, match=r"p.yaml: run: a pool file may not have a run section"):
        pool_task(Task.from_dict({"pool": {"workers": 1}, "run": "echo hi"}), "p.yaml")
    with pytest.raises(SpecError, match=r"t.yaml: not a pool file: add a `pool: \{workers: N\}` section"):
        pool_task(Task.from_dict({"setup": "echo hi"}), "t.yaml")


@pytest.mark.parametrize(
    ("mapping", "fields"),
    [
        ({"setup": "pip install x", "run": "go"}, "setup"),
        ({"workdir": ".", "run": "go"}, "workdir"),
        ({"file_mounts": {"/data": "s3://b"}, "run": "go"}, "file_mounts"),
        ({"setup": "x", "workdir": ".", "run": "go"}, "setup, workdir"),
    ],
)
def test_a_job_for_a_pool_may_not_bring_its_own_environment(mapping: dict[str, object], fields: str) -> None:
    with pytest.raises(SpecError, match=rf"^job.yaml: {fields}: a job for a pool may not have"):
        check_pool_job(Task.from_dict(mapping), "job.yaml")


def test_a_job_for_a_pool_needs_a_run() -> None:
    with pytest.raises(SpecError, match=r"job.yaml: run: a job for a pool needs a run section"):
        check_pool_job(Task.from_dict({"name": "x"}), "job.yaml")


@pytest.mark.parametrize("name", ["Pool", "1pool", "p_q", "a" * 31, ""])
def test_a_pool_name_is_a_cluster_name_prefix(name: str) -> None:
    with pytest.raises(SpecError, match="is invalid: lowercase letters, digits and '-'"):
        check_pool_name(name)


def test_job_ranks_are_skypilots_names() -> None:
    assert job_rank_envs(2, 4) == {"SKYPILOT_JOB_RANK": "2", "SKYPILOT_NUM_JOBS": "4"}
    with pytest.raises(ValueError):
        job_rank_envs(4, 4)


def test_the_pool_record_keeps_no_secret_value_and_a_replacement_gets_the_pools_setup() -> None:
    pool = Task.from_dict(
        {
            "pool": {"workers": 2},
            "setup": "pip install -r requirements.txt",
            "workdir": "/src/app",
            "envs": {"MODEL": "gpt2"},
            "secrets": {"HF_TOKEN": "hf-s3cr3t"},
        }
    )
    record = pool_task_record(pool)
    assert "hf-s3cr3t" not in str(record) and record["secret_names"] == ["HF_TOKEN"]
    job = Task.from_dict(
        {"run": "python train.py", "num_nodes": 2, "envs": {"LR": "1e-3"}, "secrets": {"WANDB": "w-key"}}
    )
    merged = worker_setup_task(job, record)
    assert merged.setup == "pip install -r requirements.txt" and merged.workdir == "/src/app"
    assert merged.run == "python train.py" and merged.num_nodes == 2
    assert merged.envs == {"MODEL": "gpt2", "LR": "1e-3"} and merged.secrets == {"WANDB": "w-key"}
