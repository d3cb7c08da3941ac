"""`image_id: docker:<image>`, `config.docker.run_options` and the SKYPILOT_DOCKER_* login, as pure rules."""

from __future__ import annotations

import warnings

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.task import SpecWarning, Task
from airflow_sky.task.container import ContainerSpec, RegistryLogin, inherited_container, registry_login


def _task(resources: dict | None = None, **fields: object) -> Task:
    return Task.from_dict({"run": "true", "resources": resources or {}, **fields})


def test_a_docker_image_id_is_the_container_and_run_options_are_split_as_a_shell_would():
    task = _task(
        {"image_id": "docker:nvcr.io/nvidia/pytorch:24.10-py3"},
        config={"docker": {"run_options": ["--shm-size=16g", "--ulimit memlock=-1 -e 'A=b c'"]}},
    )
    assert task.container == ContainerSpec(
        "nvcr.io/nvidia/pytorch:24.10-py3", ("--shm-size=16g", "--ulimit", "memlock=-1", "-e", "A=b c")
    )
    assert task.container.registry == "nvcr.io"
    assert _task({"image_id": "docker:ubuntu:22.04"}).container.registry == ""  # Docker Hub
    assert _task({"image_id": "ami-0123456789abcdef0"}).container is None  # a VM image
    assert _task().container is None


def test_docker_run_options_act_and_the_rest_of_config_is_named_inert():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _task({"image_id": "docker:ubuntu:22.04"}, config={"docker": {"run_options": "--ipc=host"}})
    assert not [w for w in caught if issubclass(w.category, SpecWarning)]
    with pytest.warns(SpecWarning, match=r"config\.kubernetes"):
        _task({"image_id": "docker:ubuntu:22.04"}, config={"kubernetes": {"x": 1}, "docker": {}})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"resources": {"image_id": "docker:"}}, r"resources\.image_id: 'docker:' is not an image reference"),
        ({"resources": {"image_id": "docker:Bad Name"}}, r"is not an image reference; give docker:"),
        (
            {"resources": {"image_id": {"us-east-1": "docker:ubuntu:22.04"}}},
            r"resources\.image_id\.us-east-1: docker:ubuntu:22\.04: a container image is one for every region",
        ),
        (
            {"config": {"docker": {"run_options": ["--ipc=host"]}}},
            r"config\.docker\.run_options: given, but resources\.image_id names no container image",
        ),
        (
            {"resources": {"image_id": "docker:ubuntu"}, "config": {"docker": {"run_options": [1]}}},
            r"config\.docker\.run_options: must be a string or a list of strings",
        ),
        (
            {"resources": {"image_id": "docker:ubuntu"}, "config": {"docker": {"run_options": ["-e 'open"]}}},
            r"config\.docker\.run_options\[0\]: .*No closing quotation",
        ),
    ],
)
def test_a_bad_image_or_run_option_is_one_line_naming_the_field(fields, message):
    with pytest.raises(SpecError, match=message) as refused:
        Task.from_dict({"run": "true", **fields})
    assert "\n" not in str(refused.value)


def test_the_registry_login_comes_from_skypilots_envs_and_never_shows_the_password():
    env = {
        "SKYPILOT_DOCKER_USERNAME": "me",
        "SKYPILOT_DOCKER_PASSWORD": "s3cret",
        "SKYPILOT_DOCKER_SERVER": "r.io",
    }
    login = registry_login(env)
    assert login == RegistryLogin("me", "s3cret", "r.io")
    assert "s3cret" not in repr(login)
    assert registry_login({}) is None
    assert registry_login({"SKYPILOT_DOCKER_USERNAME": "", "SKYPILOT_DOCKER_PASSWORD": ""}) is None
    with pytest.raises(
        SpecError, match="SKYPILOT_DOCKER_PASSWORD is empty but SKYPILOT_DOCKER_USERNAME is set"
    ):
        registry_login({"SKYPILOT_DOCKER_USERNAME": "me"})


def test_a_task_without_an_image_runs_in_the_container_its_cluster_pins_and_its_own_image_wins() -> None:
    own = ContainerSpec(image="registry.example/own:1")
    assert inherited_container(None, "registry.example/pinned:2") == ContainerSpec(
        image="registry.example/pinned:2"
    )
    assert inherited_container(own, "registry.example/pinned:2") is None  # the sync starts the task's own
    assert inherited_container(None, None) is None
