"""Containers as the runtime (SkyPilot's `image_id: docker:<image>`): pure rules, no runtime is touched.

Every node runs the image; the task's setup and run execute inside it; later jobs on a kept cluster run in
the same container. What a task says about it: the image (`resources.image_id: docker:<image>`), the extra
`docker run` options (`config.docker.run_options`, SkyPilot's field) and a private registry's login
(SkyPilot's `SKYPILOT_DOCKER_USERNAME` / `SKYPILOT_DOCKER_PASSWORD` / `SKYPILOT_DOCKER_SERVER` envs; the
password is treated as a secret wherever it was given).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.errors import SpecError

DOCKER_PREFIX = "docker:"
USERNAME_ENV = "SKYPILOT_DOCKER_USERNAME"
PASSWORD_ENV = "SKYPILOT_DOCKER_PASSWORD"
SERVER_ENV = "SKYPILOT_DOCKER_SERVER"
LOGIN_ENVS = (USERNAME_ENV, PASSWORD_ENV, SERVER_ENV)

# A reference as `docker pull` takes it: [registry[:port]/]path[:tag][@digest]. Checked so a typo fails at
# load time, not on every node; the runtime parses it again.
_REFERENCE = re.compile(
    r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z0-9]+:[A-Fa-f0-9]{32,})?$"
)


@dataclasses.dataclass(frozen=True)
class RegistryLogin:
    """A private registry's credentials (the password never reaches a log, a command line or XCom)."""

    username: str
    password: str
    server: str  # "" means the image's own registry (its first path part), as `docker login` would take it

    def __repr__(self) -> str:  # dataclass repr would print the password
        return f"RegistryLogin(username={self.username!r}, server={self.server!r})"


@dataclasses.dataclass(frozen=True)
class ContainerSpec:
    """The image every node of the job runs, and the extra `docker run` words (already split)."""

    image: str
    run_options: tuple[str, ...] = ()

    @property
    def registry(self) -> str:
        """The registry host of the image ("" for Docker Hub's short names)."""
        first, sep, _ = self.image.partition("/")
        return first if sep and ("." in first or ":" in first or first == "localhost") else ""


def is_container_image(image_id: Any) -> bool:
    return isinstance(image_id, str) and image_id.startswith(DOCKER_PREFIX)


def parse_image(image_id: Any, source: str = "resources.image_id") -> str | None:
    """The image of `image_id: docker:<image>`, None for a VM image (or none). A container image in a
    per-region mapping is refused: every node of a cluster runs one image."""
    if isinstance(image_id, dict):
        for region, value in image_id.items():
            if is_container_image(value):
                raise SpecError(
                    f"{source}.{region}: {value}: a container image is one for every region; give it as "
                    f"image_id: {value}"
                )
        return None
    if not is_container_image(image_id):
        return None
    image = str(image_id)[len(DOCKER_PREFIX) :].strip()
    if not _REFERENCE.match(image):
        raise SpecError(
            f"{source}: {image_id!r} is not an image reference; give docker:[registry/]name[:tag][@digest], "
            "e.g. docker:nvcr.io/nvidia/pytorch:24.10-py3"
        )
    return image


def parse_run_options(value: Any, source: str = "config.docker.run_options") -> tuple[str, ...]:
    """SkyPilot's `run_options`: a string or a list of strings, each split as a shell would."""
    if value is None:
        return ()
    items: Sequence[Any] = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise SpecError(f"{source}: must be a string or a list of strings, e.g. ['--shm-size=16g']")
    words: list[str] = []
    for i, item in enumerate(items):
        try:
            words += shlex.split(item)
        except ValueError as e:
            raise SpecError(f"{source}[{i}]: {item!r}: {e}") from None
    return tuple(words)


def docker_config(config: Any) -> Mapping[str, Any]:
    """`config.docker` of a task's `config` field ({} without one)."""
    if not isinstance(config, dict):
        return {}
    docker = config.get("docker")
    if docker is None:
        return {}
    if not isinstance(docker, dict):
        raise SpecError("config.docker: must be a mapping, e.g. {run_options: ['--shm-size=16g']}")
    return docker


def inert_config_paths(config: Any) -> list[str]:
    """The parts of a task's `config` that are parsed but not acted on (all but docker.run_options, hooks)."""
    if not isinstance(config, dict):
        return []
    paths = [f"config.{key}" for key in config if key not in ("docker", "hooks")]
    docker = config.get("docker")
    if isinstance(docker, dict):
        paths += [f"config.docker.{key}" for key in docker if key != "run_options"]
    return paths


def container_spec(image_id: Any, config: Any) -> ContainerSpec | None:
    """The task's container (None: the job runs on the node itself). Run options without an image refused:
    they would silently do nothing."""
    image = parse_image(image_id)
    options = parse_run_options(docker_config(config).get("run_options"))
    if image is None:
        if options:
            raise SpecError(
                "config.docker.run_options: given, but resources.image_id names no container image "
                "(image_id: docker:<image>)"
            )
        return None
    return ContainerSpec(image=image, run_options=options)


def registry_login(env: Mapping[str, str]) -> RegistryLogin | None:
    """The registry login from the task's envs and secrets (SkyPilot's names); None without one."""
    username = env.get(USERNAME_ENV, "")
    password = env.get(PASSWORD_ENV, "")
    server = env.get(SERVER_ENV, "")
    if not username and not password:
        return None
    if not username or not password:
        missing = USERNAME_ENV if not username else PASSWORD_ENV
        raise SpecError(
            f"envs/secrets: {missing} is empty but {LOGIN_ENVS[1] if missing == USERNAME_ENV else USERNAME_ENV} "
            "is set; a private registry needs both (put the password in secrets)"
        )
    return RegistryLogin(username=username, password=password, server=server)


def cluster_container(handle: Any) -> ContainerSpec | None:
    """The container a job's nodes run (a JobHandle's pinned `container_image`): for a node that replaced
    a lost one, or a node of a job whose task names no image on a cluster that runs one."""
    image = getattr(handle, "container_image", None)
    return ContainerSpec(image=image) if image else None


def inherited_container(own: ContainerSpec | None, pinned_image: str | None) -> ContainerSpec | None:
    """The container a sync starts for a task that names none (`own`) on a cluster whose job state pins an
    image: every later job of a kept cluster runs in the same container. None when the task names its own
    (the sync starts that one) or the cluster runs none."""
    return ContainerSpec(image=pinned_image) if pinned_image and own is None else None
