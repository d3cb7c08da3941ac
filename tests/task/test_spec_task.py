"""Task: reference tasks, round trips, Python construction, env overrides, substitution, warnings."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import yaml

from airflow_sky import SpecError
from airflow_sky.task import GitWorkdir, Resources, SpecWarning, StorageMount, Task

VALID_DIR = Path(__file__).parent / "valid"
VALID_FILES = sorted(VALID_DIR.glob("*.yaml"))

MINGPT_RUN = (
    'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
    "torchrun --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE \\\n"
    "  --master_addr=$MASTER_ADDR --master_port=8008 --node_rank=$SKYPILOT_NODE_RANK main.py\n"
)


def load_quietly(path: Path) -> Task:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        return Task.from_yaml(path)


def test_mingpt_ddp_reference_task_parses() -> None:
    task = Task.from_yaml(VALID_DIR / "mingpt_ddp.yaml")
    assert task.name == "minGPT-ddp"
    assert task.num_nodes == 2
    assert task.workdir == "."
    assert task.resolved_workdir == str(VALID_DIR)
    assert task.resources.cpus == "4+"
    assert task.resources.accelerators == {"L4": 4}
    assert (task.resources.accelerator_name, task.resources.accelerator_count) == ("L4", 4)
    assert task.setup == "pip install -r requirements.txt\n"
    assert task.run == MINGPT_RUN
    assert task.envs == {} and task.secrets == {} and task.file_mounts == {}


def test_mingpt_ddp_with_a100x8_parses() -> None:
    task = Task.from_yaml(VALID_DIR / "mingpt_ddp_a100.yaml")
    assert task.resources.accelerators == {"A100": 8}
    assert task.resources.to_dict() == {"cpus": "4+", "accelerators": "A100:8"}


def test_two_node_ray_task_parses() -> None:
    task = Task.from_yaml(VALID_DIR / "ray_2node.yaml")
    assert task.num_nodes == 2
    assert task.resources.accelerators == {"L4": 2}
    assert task.resources.memory == "64+"
    assert task.resolved_workdir == str(VALID_DIR)
    assert task.setup is not None and "ray[default]" in task.setup
    assert task.run is not None and "ray start --head" in task.run


def test_kitchen_sink_task_normalizes_every_field() -> None:
    task = load_quietly(VALID_DIR / "everything.yaml")
    assert task.workdir == "./src/minigpt"
    assert task.envs == {"PROJECT": "minigpt", "EPOCHS": "10", "LR": "0.0003", "EMPTY": ""}
    assert task.secrets == {"HF_TOKEN": "hf_dummy"}
    assert task.file_mounts == {
        "/data/minigpt": "s3://my-bucket/minigpt/data",
        "~/checkpoints": StorageMount(name="ckpt-minigpt", store="s3", mode="MOUNT_CACHED", persistent=True),
        "/config": "./config",
        "/inputs": StorageMount(source=("./a.txt", "./b.txt"), mode="COPY"),
    }
    assert task.setup == "set -e\npip install -r requirements.txt"
    r = task.resources
    assert (r.cloud, r.region, r.zone) == ("gcp", "us-central1", "us-central1-a")
    assert (r.cpus, r.memory, r.disk_size, r.use_spot) == ("8", "32+", 256, True)
    assert r.accelerators == {"A100": 8, "H100": 8}
    assert r.job_recovery is not None and r.job_recovery.strategy == "FAILOVER"
    assert r.job_recovery.recover_on_exit_codes == (33, 34)
    assert r.ports == ("8080", "10000-10010")
    assert [c.infra for c in r.candidates()] == [
        "gcp/us-central1/us-central1-a",
        "gcp/us-central1/us-central1-a",
        "aws/us-east-1",
        "aws/us-east-1",
    ]
    assert [c.accelerator_name for c in r.candidates()] == ["A100", "H100", "A100", "H100"]
    assert set(task.extra_fields) == {"service", "config", "event_callback"}


@pytest.mark.parametrize("path", VALID_FILES, ids=[p.stem for p in VALID_FILES])
def test_to_yaml_round_trips_to_an_equal_task(path: Path) -> None:
    task = load_quietly(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        again = Task.from_yaml_str(task.to_yaml())
        from_dict = Task.from_dict(task.to_dict())
    assert again == task
    assert again.to_yaml() == task.to_yaml()
    assert from_dict == task


def test_to_yaml_writes_scripts_as_literal_blocks() -> None:
    text = Task.from_yaml(VALID_DIR / "mingpt_ddp.yaml").to_yaml()
    assert "run: |\n  MASTER_ADDR=" in text
    assert yaml.safe_load(text)["run"] == MINGPT_RUN


def test_empty_yaml_is_a_default_single_node_task() -> None:
    task = Task.from_yaml_str("")
    assert task.num_nodes == 1 and task.run is None and task.resources == Resources()
    assert task.to_dict() == {"num_nodes": 1}


def test_top_level_null_means_absent() -> None:
    assert Task.from_yaml_str("name: a\nsetup:\nenvs:\nresources:\n") == Task(name="a")


def test_python_construction_with_list_setup_and_run_equals_the_yaml_form() -> None:
    task = Task(
        "minGPT-ddp",
        setup=["pip install -r requirements.txt", ""],
        run=["echo one", "echo two"],
        envs={"EPOCHS": 10},
        num_nodes=2,
        workdir=".",
        resources=Resources(cpus="4+", accelerators="L4:4"),
    )
    assert task.setup == "pip install -r requirements.txt\n"
    assert task.run == "echo one\necho two"
    assert task.envs == {"EPOCHS": "10"}
    text = """
name: minGPT-ddp
setup: |
  pip install -r requirements.txt
run: |-
  echo one
  echo two
envs: {EPOCHS: 10}
num_nodes: 2
workdir: .
resources: {cpus: 4+, accelerators: L4:4}
"""
    assert Task.from_yaml_str(text) == task


def test_python_construction_errors_name_the_python_source() -> None:
    with pytest.raises(SpecError, match=r"^<python>: num_nodes: must be an integer >= 1, got 0$"):
        Task(num_nodes=0)
    with pytest.raises(SpecError, match=r"^<python>: resources\.accelerators: "):
        Task(resources={"accelerators": "L4:-1"})
    task = Task()
    with pytest.raises(SpecError, match=r"^<python>: num_nodes: "):
        task.num_nodes = 0


def test_set_resources_accepts_resources_or_a_mapping_and_chains() -> None:
    task = Task(run="true")
    assert task.set_resources(Resources(accelerators="A100:8")) is task
    assert task.resources.accelerator_name == "A100"
    task.set_resources({"cpus": 16, "infra": "aws/us-east-1"})
    assert task.resources.to_dict() == {"infra": "aws/us-east-1", "cpus": "16"}
    with pytest.raises(SpecError, match=r"resources\.cpu: unknown field; did you mean 'cpus'\?"):
        task.set_resources({"cpu": 1})


def test_update_envs_validates_and_stringifies() -> None:
    task = Task(envs={"A": "1"}).update_envs({"B": 2})
    assert task.envs == {"A": "1", "B": "2"}
    with pytest.raises(SpecError, match=r"envs\.bad-name: invalid name"):
        task.update_envs({"bad-name": "x"})


def test_update_envs_changes_the_task_and_with_envs_a_copy() -> None:
    task = Task(envs={"A": "1"}, file_mounts={"/data": {"name": "bucket", "store": "s3"}})
    assert task.update_envs({"B": "2"}) is task and task.envs == {"A": "1", "B": "2"}
    copied = task.with_envs({"C": 3})
    assert copied is not task and copied.envs == {"A": "1", "B": "2", "C": "3"}
    assert task.envs == {"A": "1", "B": "2"}
    assert copied.file_mounts == task.file_mounts and copied.resources == task.resources
    with pytest.raises(SpecError, match=r"envs\.bad-name: invalid name"):
        task.with_envs({"bad-name": "x"})
    assert task.envs == {"A": "1", "B": "2"}


def test_loaders_refuse_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match="env_overide"):
        Task.from_dict({"run": "true"}, env_overide={"A": "1"})  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="env_overide"):
        Task.from_yaml_str("run: true", env_overide={"A": "1"})  # type: ignore[call-arg]


def test_git_workdir_is_accepted_and_has_no_local_path() -> None:
    task = Task.from_yaml_str("workdir: {url: https://github.com/karpathy/minGPT.git, ref: master}")
    assert task.workdir == GitWorkdir(url="https://github.com/karpathy/minGPT.git", ref="master")
    assert task.resolved_workdir is None
    assert Task.from_yaml_str(task.to_yaml()) == task


def test_relative_workdir_resolves_against_the_yaml_directory_but_stays_as_written(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    path = tmp_path / "job" / "task.yaml"
    path.write_text("workdir: ../code\n")
    task = Task.from_yaml(path)
    assert task.workdir == "../code"
    assert task.resolved_workdir == str(tmp_path / "code")
    assert "workdir: ../code" in task.to_yaml()


def test_home_relative_workdir_expands_home() -> None:
    task = Task.from_yaml_str("workdir: ~/project")
    assert task.resolved_workdir == os.path.join(os.path.expanduser("~"), "project")


def test_null_env_is_filled_from_env_overrides() -> None:
    text = "envs:\n  WANDB_PROJECT: null\n  EPOCHS: 3\n"
    task = Task.from_yaml_str(text, env_overrides={"WANDB_PROJECT": "demo"})
    assert task.envs == {"WANDB_PROJECT": "demo", "EPOCHS": "3"}


def test_null_env_without_override_names_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError) as info:
        Task.from_yaml_str("envs:\n  WANDB_PROJECT:\n")
    assert str(info.value) == (
        "<string>: envs.WANDB_PROJECT: has no value; pass it at launch with --env WANDB_PROJECT=VALUE "
        "(or in --env-file)"
    )


def test_env_precedence_is_env_args_over_env_file_over_yaml_as_in_skypilot(tmp_path: Path) -> None:
    env_file = tmp_path / "launch.env"
    env_file.write_text("FROM_FILE=file\nBOTH=file\n")
    text = "envs:\n  FROM_YAML: yaml\n  BOTH: yaml\n  FROM_ARG: yaml\n  FROM_FILE: yaml\n"
    task = Task.from_yaml_str(
        text, env_overrides={"FROM_ARG": "arg", "BOTH": "arg", "NEW": "arg"}, env_file=env_file
    )
    assert task.envs == {
        "FROM_YAML": "yaml",
        "BOTH": "arg",
        "FROM_ARG": "arg",
        "FROM_FILE": "file",
        "NEW": "arg",
    }


def test_overrides_of_a_secret_stay_secret() -> None:
    task = Task.from_yaml_str("secrets:\n  HF_TOKEN: null\n", env_overrides={"HF_TOKEN": "hf_123"})
    assert task.secrets == {"HF_TOKEN": "hf_123"}
    assert "HF_TOKEN" not in task.envs


def test_secrets_are_redacted_on_request_only() -> None:
    task = Task.from_yaml_str("secrets: {HF_TOKEN: hf_123}")
    assert task.to_dict()["secrets"] == {"HF_TOKEN": "hf_123"}
    assert task.to_dict(redact_secrets=True)["secrets"] == {"HF_TOKEN": "<redacted>"}
    assert "hf_123" not in task.to_yaml(redact_secrets=True)


def test_vars_in_workdir_and_file_mounts_are_substituted_from_final_envs() -> None:
    text = """
envs: {PROJECT: gpt, BUCKET: null}
secrets: {SUB: s3cret}
workdir: ~/code/$PROJECT
file_mounts:
  /data/${PROJECT}: s3://$BUCKET/${PROJECT}/$SUB
  /ckpt:
    name: ckpt-$PROJECT
    source: ./out/${PROJECT}
    mode: COPY
  /keep: ./lit/$UNKNOWN/$$PROJECT
"""
    task = Task.from_yaml_str(text, env_overrides={"BUCKET": "bkt"})
    assert task.workdir == "~/code/gpt"
    assert task.file_mounts == {
        "/data/gpt": "s3://bkt/gpt/s3cret",
        "/ckpt": StorageMount(name="ckpt-gpt", source="./out/gpt", mode="COPY"),
        "/keep": "./lit/$UNKNOWN/$PROJECT",
    }


def test_literal_dollar_that_would_resubstitute_is_escaped_so_round_trip_holds() -> None:
    task = Task.from_yaml_str("envs: {PROJECT: gpt}\nfile_mounts:\n  /keep: ./lit/$$PROJECT\n")
    assert task.file_mounts == {"/keep": "./lit/$PROJECT"}
    assert task.to_dict()["file_mounts"] == {"/keep": "./lit/$$PROJECT"}
    assert Task.from_yaml_str(task.to_yaml()) == task


def test_unsupported_fields_give_one_warning_listing_all_and_round_trip() -> None:
    text = """
service: {replicas: 2}
event_callback: echo done
resources:
  ports: 8080
  labels: {team: ml}
  priority: 10
  any_of:
    - disk_tier: best
      accelerator_args: {tpu_vm: true}
"""
    with pytest.warns(SpecWarning) as record:
        task = Task.from_yaml_str(text)
    assert len(record) == 1
    message = str(record[0].message)
    for field in (
        "resources.priority",
        "resources.any_of.0.accelerator_args",
        "service",
        "event_callback",
    ):
        assert field in message
    for acting in ("ports", "labels", "disk_tier"):  # they act on aws and gcp
        assert acting not in message
    data = task.to_dict()
    assert data["service"] == {"replicas": 2} and data["event_callback"] == "echo done"
    assert data["resources"]["ports"] == ["8080"] and data["resources"]["labels"] == {"team": "ml"}


def test_supported_fields_alone_give_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Task.from_yaml(VALID_DIR / "mingpt_ddp.yaml")
        Task.from_yaml(VALID_DIR / "ray_2node.yaml")


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: a\nresources: {cpus: 4\nrun: echo\n")
    with pytest.raises(SpecError) as info:
        Task.from_yaml(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: line 3, column ")
    assert "invalid YAML" in message


def test_duplicate_keys_are_rejected_with_their_line() -> None:
    with pytest.raises(SpecError, match=r"^<string>: line 3, column 1: invalid YAML: duplicate key 'run'$"):
        Task.from_yaml_str("run: a\nname: x\nrun: b\n")


def test_yaml_merge_keys_may_override_merged_values() -> None:
    text = "x-base: &base {cpus: 2, memory: 8}\n"
    with pytest.raises(SpecError, match="x-base: unknown field"):
        Task.from_yaml_str(text)
    task = Task.from_yaml_str("resources:\n  <<: {cpus: 2, memory: 8}\n  cpus: 4\n")
    assert task.resources.to_dict() == {"cpus": "4", "memory": "8"}


def test_multi_document_yaml_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"^<string>: found 2 YAML documents"):
        Task.from_yaml_str("name: a\n---\nname: b\n")


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read"):
        Task.from_yaml(tmp_path / "nope.yaml")


def test_spec_and_envs_do_not_import_airflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys, airflow_sky, airflow_sky.task, airflow_sky.task.envs; airflow_sky.Task; "
        "sys.exit(any(m == 'airflow' or m.startswith('airflow.') for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], timeout=60)
    assert result.returncode == 0


def test_python_construction_accepts_the_spec_value_classes(tmp_path: Path) -> None:
    task = Task(
        workdir=GitWorkdir(url="https://example.com/repo.git"),
        file_mounts={"/ckpt": StorageMount(name="bucket", mode="COPY"), "/cfg": "./cfg"},
    )
    assert task.workdir == GitWorkdir(url="https://example.com/repo.git")
    assert task.file_mounts["/ckpt"] == StorageMount(name="bucket", mode="COPY")
    assert Task(workdir=tmp_path).workdir == str(tmp_path)


def test_python_null_env_needs_a_value() -> None:
    with pytest.raises(SpecError, match=r"^<python>: envs\.TOKEN: has no value"):
        Task(envs={"TOKEN": None})
