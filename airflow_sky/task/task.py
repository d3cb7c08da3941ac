"""`Task`: a SkyPilot-style job (setup, run, envs, workdir, file_mounts, resources, num_nodes)."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.task import overrides as ov
from airflow_sky.task.diagnostics import PYTHON_SOURCE, STRING_SOURCE, SpecContext, show
from airflow_sky.task.resources import JobRecovery, Resources, build_resources
from airflow_sky.task.schema import BUCKET_URI_SCHEMES, INERT_TASK_FIELDS, TASK_SCHEMA
from airflow_sky.task.validate import validate
from airflow_sky.task.yaml_io import dump_yaml, parse_yaml

REDACTED = "<redacted>"
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")


@dataclasses.dataclass(frozen=True)
class GitWorkdir:
    """A workdir cloned from git instead of synced from a local directory."""

    url: str
    ref: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"url": self.url} | ({"ref": self.ref} if self.ref is not None else {})


@dataclasses.dataclass(frozen=True)
class StorageMount:
    """A file_mounts storage mapping: a bucket (`name`/`store`) and/or a `source`, mounted or copied."""

    name: str | None = None
    source: str | tuple[str, ...] | None = None
    store: str | None = None  # lower case: s3, gcs, r2, ...
    mode: str | None = None  # upper case: MOUNT (SkyPilot's default), COPY, MOUNT_CACHED
    persistent: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if isinstance(self.source, tuple):
            data["source"] = list(self.source)
        return {key: value for key, value in data.items() if value is not None}


FileMountSource = str | StorageMount


def is_bucket_uri(text: str) -> bool:
    """True for 's3://...', 'gs://...' and the other bucket URIs file_mounts accept."""
    match = _URI.match(text)
    return match is not None and match["scheme"].lower() in BUCKET_URI_SCHEMES


class Task:
    """A SkyPilot-style task. Build it like `sky.Task(...)` or load it with `Task.from_yaml(path)`.

    Every problem raises `airflow_sky.SpecError` with a one-line message naming the source and field.
    """

    # Airflow renders these per run when the task sits in a DAG ({{ ds }}, {{ params.x }}, {{ dag_run.conf }});
    # shell `$VAR`/`${VAR}` pass through Jinja untouched.
    template_fields: tuple[str, ...] = ("setup", "run", "envs", "secrets")

    name: str | None
    setup: str | None
    run: str | None
    envs: dict[str, str]
    secrets: dict[str, str]
    workdir: str | GitWorkdir | None
    file_mounts: dict[str, FileMountSource]
    resources: Resources
    extra_fields: dict[str, Any]  # top-level fields parsed and kept but not acted on yet
    base_dir: str | None  # where a relative workdir/local path resolves: the YAML's directory, else the cwd

    def __init__(
        self,
        name: str | None = None,
        *,
        setup: str | Sequence[str] | None = None,
        run: str | Sequence[str] | None = None,
        envs: Mapping[str, str | int | float | None] | None = None,
        secrets: Mapping[str, str | int | float | None] | None = None,
        workdir: str | os.PathLike[str] | GitWorkdir | Mapping[str, str] | None = None,
        num_nodes: int | None = None,
        file_mounts: Mapping[str, str | StorageMount | Mapping[str, Any]] | None = None,
        resources: Resources | Mapping[str, Any] | None = None,
    ):
        config: dict[str, Any] = {
            "name": name,
            "setup": list(setup) if isinstance(setup, list | tuple) else setup,
            "run": list(run) if isinstance(run, list | tuple) else run,
            "envs": dict(envs) if isinstance(envs, Mapping) else envs,
            "secrets": dict(secrets) if isinstance(secrets, Mapping) else secrets,
            "workdir": os.fspath(workdir) if isinstance(workdir, os.PathLike) else _plain(workdir),
            "num_nodes": num_nodes,
            "file_mounts": _plain(file_mounts),
            "resources": None if isinstance(resources, Resources) else _plain(resources),
        }
        ctx = SpecContext(PYTHON_SOURCE)
        self._load(config, ctx, base_dir=None, overrides={})
        if isinstance(resources, Resources):
            self.resources = resources
        ctx.warn_inert()

    # -- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        config: Any,
        *,
        source: str = PYTHON_SOURCE,
        base_dir: str | None = None,
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
    ) -> Task:
        """Validate a task mapping (a parsed YAML document). Warns once (SpecWarning) about inert fields."""
        file_values = ov.read_env_file(env_file) if env_file is not None else None
        task = cls.__new__(cls)
        ctx = SpecContext(source)
        task._load(config, ctx, base_dir=base_dir, overrides=ov.merge_overrides(env_overrides, file_values))
        ctx.warn_inert()
        return task

    @classmethod
    def from_yaml_str(
        cls,
        text: str,
        *,
        source: str = STRING_SOURCE,
        base_dir: str | None = None,
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
    ) -> Task:
        """Parse YAML text (with yaml.safe_load rules); see `from_dict`."""
        config = parse_yaml(text, source)
        return cls.from_dict(
            config, source=source, base_dir=base_dir, env_overrides=env_overrides, env_file=env_file
        )

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike[str],
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
    ) -> Task:
        """Load a task file; a relative `workdir` resolves against the file's directory."""
        source = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as stream:
                text = stream.read()
        except OSError as e:
            raise SpecError(f"{source}: cannot read: {e.strerror or e}") from e
        base_dir = os.path.dirname(os.path.abspath(source))
        return cls.from_yaml_str(
            text, source=source, base_dir=base_dir, env_overrides=env_overrides, env_file=env_file
        )

    def _load(
        self, config: Any, ctx: SpecContext, *, base_dir: str | None, overrides: Mapping[str, str]
    ) -> None:
        if isinstance(config, dict):
            config = {key: value for key, value in config.items() if value is not None}
        validate(config, TASK_SCHEMA, ctx)
        self.base_dir = base_dir
        envs, secrets = ov.apply_overrides(config.get("envs", {}), config.get("secrets", {}), overrides)
        self.envs = _env_values(envs, "envs", ctx)
        self.secrets = _env_values(secrets, "secrets", ctx)
        self.name = config.get("name")
        self._num_nodes = config.get("num_nodes", 1)
        self.setup = _script(config.get("setup"))
        self.run = _script(config.get("run"))
        mapping = self.envs_and_secrets
        workdir = ov.substitute(config.get("workdir"), mapping)
        if isinstance(workdir, dict):
            self.workdir = GitWorkdir(url=workdir["url"], ref=workdir.get("ref"))
        elif isinstance(workdir, str) and not workdir.strip():
            raise ctx.error(["workdir"], "must be a directory path, got an empty string")
        else:
            self.workdir = workdir
        self.file_mounts = _file_mounts(config.get("file_mounts", {}), mapping, ctx)
        self.resources = build_resources(config.get("resources", {}), ctx)
        self.extra_fields = {key: copy.deepcopy(config[key]) for key in INERT_TASK_FIELDS if key in config}
        for key in self.extra_fields:
            ctx.note_inert([key])

    # -- editing -------------------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecContext(PYTHON_SOURCE).error(
                ["num_nodes"], f"must be an integer >= 1, got {show(value)}"
            )
        self._num_nodes = value

    def set_resources(self, resources: Resources | Mapping[str, Any]) -> Task:
        """Replace the resources (a Resources or a YAML-style mapping); returns self for chaining."""
        self.resources = resources if isinstance(resources, Resources) else Resources.from_dict(resources)
        return self

    def update_envs(self, envs: Mapping[str, str | int | float]) -> Task:
        """Add or replace envs (validated like the YAML's); returns self."""
        self.envs.update(_env_values(_validated_env_map(envs, "envs"), "envs", SpecContext()))
        return self

    def update_secrets(self, secrets: Mapping[str, str | int | float]) -> Task:
        """Add or replace secrets (validated like the YAML's); returns self."""
        self.secrets.update(_env_values(_validated_env_map(secrets, "secrets"), "secrets", SpecContext()))
        return self

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def envs_and_secrets(self) -> dict[str, str]:
        """Envs then secrets (a secret wins on a shared name), as jobs see them."""
        return {**self.envs, **self.secrets}

    @property
    def job_recovery(self) -> JobRecovery:
        """The resources' recovery policy, or the default one."""
        return self.resources.job_recovery or JobRecovery()

    def resolve_local_path(self, path: str) -> str:
        """An absolute local path: `~` expanded, relative paths against `base_dir` (else the cwd)."""
        expanded = os.path.expanduser(path)
        return os.path.normpath(os.path.join(self.base_dir or os.getcwd(), expanded))

    @property
    def resolved_workdir(self) -> str | None:
        """The local workdir as an absolute path; None without one or for a git workdir."""
        return self.resolve_local_path(self.workdir) if isinstance(self.workdir, str) else None

    def to_dict(self, *, redact_secrets: bool = False) -> dict[str, Any]:
        """The normalized task mapping; `Task.from_dict(task.to_dict())` equals `task`."""
        mapping = self.envs_and_secrets
        workdir = self.workdir.to_dict() if isinstance(self.workdir, GitWorkdir) else self.workdir
        mounts = {
            dst: src.to_dict() if isinstance(src, StorageMount) else src
            for dst, src in self.file_mounts.items()
        }
        secrets = {key: REDACTED for key in self.secrets} if redact_secrets else dict(self.secrets)
        data: dict[str, Any] = {
            "name": self.name,
            "workdir": ov.protect(workdir, mapping),
            "num_nodes": self.num_nodes,
            "resources": self.resources.to_dict() or None,
            "envs": dict(self.envs) or None,
            "secrets": secrets or None,
            "file_mounts": ov.protect(mounts, mapping) or None,
            "setup": self.setup,
            "run": self.run,
            **copy.deepcopy(self.extra_fields),
        }
        return {key: value for key, value in data.items() if value is not None}

    def to_yaml(self, *, redact_secrets: bool = False) -> str:
        """YAML text of `to_dict()`; scripts are written as `|` blocks."""
        return dump_yaml(self.to_dict(redact_secrets=redact_secrets))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable; equality is by value

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, num_nodes={self.num_nodes}, resources={self.resources!r})"


def load_task(
    path: str | os.PathLike[str],
    env_overrides: Mapping[str, str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
) -> Task:
    """`Task.from_yaml`, as a function."""
    return Task.from_yaml(path, env_overrides=env_overrides, env_file=env_file)


def _plain(value: Any) -> Any:
    """Mappings/tuples from Python callers -> dicts/lists, the shapes the schema checks."""
    if isinstance(value, Resources):
        return value.to_dict()
    if isinstance(value, StorageMount | GitWorkdir):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _script(value: str | list[str] | None) -> str | None:
    return "\n".join(value) if isinstance(value, list) else value


def _validated_env_map(values: Mapping[str, Any], field: str) -> dict[str, Any]:
    config = {field: dict(values)}
    validate(config, TASK_SCHEMA, SpecContext())
    return config[field]


def _env_values(values: Mapping[str, Any], field: str, ctx: SpecContext) -> dict[str, str]:
    """Schema-checked env values -> strings (numbers as written); a null left unset at launch is an error."""
    result: dict[str, str] = {}
    for key, value in values.items():
        if value is None:
            raise ctx.error(
                [field, key], f"has no value; pass it at launch with --env {key}=VALUE (or in --env-file)"
            )
        result[key] = value if isinstance(value, str) else str(value)
    return result


def _file_mounts(
    mounts: dict[str, Any], envs: Mapping[str, str], ctx: SpecContext
) -> dict[str, FileMountSource]:
    """Schema-checked file_mounts, `$VAR`s substituted -> {remote path: local path/URI or StorageMount}."""
    result: dict[str, FileMountSource] = {}
    for raw_dst, raw_src in mounts.items():
        dst, src = ov.substitute(raw_dst, envs), ov.substitute(raw_src, envs)
        path = ["file_mounts", dst]
        if not (dst.startswith("/") or dst.startswith("~/")):
            raise ctx.error(path, f"remote path must be absolute or start with '~/', got {show(dst)}")
        if dst in result:
            raise ctx.error(path, f"remote path given twice (as {raw_dst!r} after $VAR substitution)")
        if isinstance(src, str):
            result[dst] = _mount_source(src, ctx, path)
            continue
        if "name" not in src and "source" not in src:
            raise ctx.error(path, "a storage mapping needs a `name` (bucket) or a `source`")
        source = src.get("source")
        if isinstance(source, str):
            _mount_source(source, ctx, [*path, "source"])
        result[dst] = StorageMount(
            name=src.get("name"),
            source=tuple(source) if isinstance(source, list) else source,
            store=src["store"].lower() if "store" in src else None,
            mode=src["mode"].upper() if "mode" in src else None,
            persistent=src.get("persistent"),
        )
    return result


def _mount_source(src: str, ctx: SpecContext, path: Sequence[Any]) -> str:
    if not src.strip():
        raise ctx.error(path, "must be a local path, a bucket URI or a storage mapping, got an empty string")
    match = _URI.match(src)
    if match and match["scheme"].lower() not in BUCKET_URI_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in BUCKET_URI_SCHEMES)
        raise ctx.error(path, f"unsupported URI scheme {match['scheme']!r}; supported: {schemes}")
    return src
