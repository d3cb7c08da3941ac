"""`Task`: a SkyPilot-style job (setup, run, envs, workdir, file_mounts, resources, num_nodes)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, Unpack

from airflow_sky.errors import SpecError
from airflow_sky.task import overrides as ov
from airflow_sky.task.container import ContainerSpec, container_spec, inert_config_paths
from airflow_sky.task.diagnostics import (
    PYTHON_SOURCE,
    STRING_SOURCE,
    SpecContext,
    show,
    unknown_field_message,
)
from airflow_sky.task.env_values import checked_env_values, env_scalars_as_strings, env_values
from airflow_sky.task.hooks import LifecycleHook, hooks_config, parse_hooks
from airflow_sky.task.job_recovery import JobRecovery
from airflow_sky.task.loading import LoadOptions, checked_options, file_options, refuse_internal, script
from airflow_sky.task.mounts import FileMountSource, StorageMount, parse_file_mounts
from airflow_sky.task.pool import PoolSpec, parse_pool
from airflow_sky.task.redaction import redact_json, redactor
from airflow_sky.task.resources import Resources, build_resources
from airflow_sky.task.schema import ACTED_EXTRA_TASK_FIELDS, INERT_TASK_FIELDS, TASK_SCHEMA
from airflow_sky.task.text_files import read_text_file
from airflow_sky.task.validate import validate
from airflow_sky.task.yaml_io import dump_yaml, parse_yaml

P = ParamSpec("P")

REDACTED = "<redacted>"
_SUBSTITUTED_EXTRA = ("service", "volumes")  # inert fields SkyPilot fills envs into


@dataclasses.dataclass(frozen=True)
class GitWorkdir:
    """A workdir cloned from git instead of synced from a local directory."""

    url: str
    ref: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"url": self.url} | ({"ref": self.ref} if self.ref is not None else {})


def _unknown_kwargs_are_spec_errors(init: Callable[P, None]) -> Callable[P, None]:
    """`Task(num_node=2)`: a SpecError with a did-you-mean, as for an unknown YAML field, not a TypeError."""
    allowed = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        for key in kwargs:
            if key not in allowed:
                raise SpecError(f"{PYTHON_SOURCE}: Task({key}=...): {unknown_field_message(key, allowed)}")
        init(*args, **kwargs)

    return checked


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
    unset: dict[str, str]  # a template's null envs/secrets (name -> "envs"/"secrets"); see allow_unset
    base_dir: str | None  # where a relative workdir/local path resolves: the YAML's directory, else the cwd

    @_unknown_kwargs_are_spec_errors
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
    def from_dict(cls, config: Any, **options: Unpack[LoadOptions]) -> Task:
        """Validate a task mapping (a parsed YAML document). Warns once (SpecWarning) about inert fields.

        `allow_unset`: a template check: envs/secrets left null (no launch value) are listed in `task.unset`
        instead of being an error; such a task is not launchable. See LoadOptions for the other keywords.
        """
        env_file = checked_options(options).get("env_file")
        file_values = ov.read_env_file(env_file) if env_file is not None else None
        task = cls.__new__(cls)
        ctx = SpecContext(options.get("source", PYTHON_SOURCE))
        task._load(
            config,
            ctx,
            base_dir=options.get("base_dir"),
            overrides=ov.merge_overrides(options.get("env_overrides"), file_values),
            allow_unset=options.get("allow_unset", False),
        )
        ctx.warn_inert()
        return task

    @classmethod
    def from_yaml_str(cls, text: str, **options: Unpack[LoadOptions]) -> Task:
        """Parse YAML text (with yaml.safe_load rules); see `from_dict`."""
        options.setdefault("source", STRING_SOURCE)
        return cls.from_dict(parse_yaml(text, options["source"]), **options)

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike[str],
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
        *,
        allow_unset: bool = False,
    ) -> Task:
        """Load a task file; a relative `workdir` resolves against the file's directory."""
        options = file_options(path, env_overrides, env_file, allow_unset)
        return cls.from_yaml_str(read_text_file(path), **options)

    def _load(
        self,
        config: Any,
        ctx: SpecContext,
        *,
        base_dir: str | None,
        overrides: Mapping[str, str],
        allow_unset: bool = False,
    ) -> None:
        if isinstance(config, dict):
            config = {key: value for key, value in config.items() if value is not None}
            refuse_internal(config, ctx)
            config = env_scalars_as_strings(config)
        validate(config, TASK_SCHEMA, ctx)
        self.base_dir = base_dir
        envs, secrets = ov.apply_overrides(config.get("envs", {}), config.get("secrets", {}), overrides)
        self.unset = {key: "envs" for key, value in envs.items() if value is None} if allow_unset else {}
        self.unset |= {key: "secrets" for key, value in secrets.items() if value is None and allow_unset}
        self.envs = env_values({k: v for k, v in envs.items() if k not in self.unset}, "envs", ctx)
        self.secrets = env_values({k: v for k, v in secrets.items() if k not in self.unset}, "secrets", ctx)
        self.name = config.get("name")
        self._num_nodes = config.get("num_nodes", 1)
        self.setup = script(config.get("setup"))
        self.run = script(config.get("run"))
        try:
            self._load_substituted(config, ctx)
        except SpecError as e:  # a message may quote a value that a secret was substituted into
            raise SpecError(self.hide_secrets(str(e))) from None
        try:
            self.container  # noqa: B018 - validated now, so a bad image fails at load time
            self.hooks  # noqa: B018 - and bad lifecycle hooks
            self.pool  # noqa: B018 - and a bad pool section
        except SpecError as e:
            raise SpecError(f"{ctx.source}: {e}") from None
        for key in [k for k in self.extra_fields if k not in ACTED_EXTRA_TASK_FIELDS]:
            for path in inert_config_paths(self.extra_fields[key]) if key == "config" else [key]:
                ctx.note_inert([path])
        for dst, src in self.file_mounts.items():
            if isinstance(src, StorageMount) and src.config is not None:
                ctx.note_inert(["file_mounts", dst, "config"])

    def _load_substituted(self, config: Mapping[str, Any], ctx: SpecContext) -> None:
        """The fields that envs and secrets are substituted into (`$VAR`), and the resources."""
        mapping = self.envs_and_secrets
        workdir = ov.substitute(config.get("workdir"), mapping)
        if isinstance(workdir, dict):
            self.workdir = GitWorkdir(url=workdir["url"], ref=workdir.get("ref"))
        elif isinstance(workdir, str) and not workdir.strip():
            raise ctx.error(["workdir"], "must be a directory path, got an empty string")
        else:
            self.workdir = workdir
        self.file_mounts = parse_file_mounts(
            config.get("file_mounts", {}), mapping, ctx, unset=tuple(self.unset)
        )
        self.resources = build_resources(config.get("resources", {}), ctx)
        # SkyPilot also fills envs into `service` and `volumes` (kept, not acted on).
        self.extra_fields = {
            key: ov.substitute(copy.deepcopy(config[key]), mapping)
            if key in _SUBSTITUTED_EXTRA
            else copy.deepcopy(config[key])
            for key in (*INERT_TASK_FIELDS, *ACTED_EXTRA_TASK_FIELDS)
            if key in config
        }

    def hide_secrets(self, value: Any) -> Any:
        """`value` (text or plain data) with every secret value, wherever `$VAR` put it, as <redacted>:
        for messages about fields that secrets were substituted into (paths, URLs, bucket names)."""
        return redact_json(value, redactor(self.secrets.values(), mask=REDACTED))

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
        """Add or replace envs (validated like the YAML's) in this task, as SkyPilot's does; returns self.
        `with_envs` leaves the task as it is and returns a changed copy."""
        self.envs.update(checked_env_values(envs, "envs"))
        return self

    def with_envs(self, envs: Mapping[str, str | int | float]) -> Task:
        """A copy of this task with envs added or replaced (validated like the YAML's); self is unchanged."""
        return copy.deepcopy(self).update_envs(envs)

    def update_secrets(self, secrets: Mapping[str, str | int | float]) -> Task:
        """Add or replace secrets (validated like the YAML's); returns self."""
        self.secrets.update(checked_env_values(secrets, "secrets"))
        return self

    def update_workdir(self, *, git_url: str | None = None, git_ref: str | None = None) -> Task:
        """`--git-url`/`--git-ref` applied as `sky launch` does: a URL makes the workdir a git workdir (a git
        workdir keeps its ref unless one is given too); a ref alone changes a git workdir's ref. Returns self.
        """
        if git_url is None and git_ref is None:
            return self
        current = self.workdir if isinstance(self.workdir, GitWorkdir) else None
        if git_url is None and current is None:
            has = "a local workdir" if self.workdir is not None else "no workdir"
            raise SpecError(
                f"--git-ref {git_ref}: the task has {has}, and a ref needs a git repository; "
                "give --git-url URL too (or `workdir: {url: URL, ref: REF}` in the YAML)"
            )
        url = git_url if git_url is not None else current.url if current is not None else ""
        if not url.strip():
            raise SpecError("--git-url: must be a git URL (https://host/owner/repo or git@host:owner/repo)")
        ref = git_ref if git_ref is not None else current.ref if current is not None else None
        self.workdir = GitWorkdir(url=url, ref=ref or None)
        return self

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def envs_and_secrets(self) -> dict[str, str]:
        """Envs then secrets (a secret wins on a shared name), as jobs see them."""
        return {**self.envs, **self.secrets}

    @property
    def container(self) -> ContainerSpec | None:
        """The image every node runs the job in (`image_id: docker:<image>`), None: on the node itself."""
        return container_spec(self.resources.image_id, self.extra_fields.get("config"))

    @property
    def hooks(self) -> tuple[LifecycleHook, ...]:
        """The lifecycle hooks (`config.hooks`) that run on stop, preemption and down."""
        return parse_hooks(hooks_config(self.extra_fields.get("config")))

    @property
    def pool(self) -> PoolSpec | None:
        """The `pool:` section of a pool file (task.pool), None for a job's task."""
        return parse_pool(self.extra_fields.get("pool"))

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

    def to_dict(self, *, redact_secrets: bool = False, secret_references: bool = False) -> dict[str, Any]:
        """The normalized task mapping; `Task.from_dict(task.to_dict())` equals `task`.

        `redact_secrets`: secrets' values as <redacted>, in `secrets` and wherever `$VAR` put them (to show).
        `secret_references`: where `$VAR` put a secret's value (a token in a git URL), `${NAME}` instead, so
        the mapping can travel without the value and load back equal once the secrets are given.
        """
        mapping = self.envs_and_secrets
        workdir = self.workdir.to_dict() if isinstance(self.workdir, GitWorkdir) else self.workdir
        mounts = {
            dst: src.to_dict() if isinstance(src, StorageMount) else src
            for dst, src in self.file_mounts.items()
        }
        extra = copy.deepcopy(self.extra_fields)
        if redact_secrets:  # secrets substituted into paths, URLs and inert fields too
            workdir, mounts, extra = (self.hide_secrets(part) for part in (workdir, mounts, extra))
        secrets: dict[str, Any] = (
            {key: REDACTED for key in self.secrets} if redact_secrets else dict(self.secrets)
        )
        envs: dict[str, Any] = dict(self.envs)
        for key, field in getattr(self, "unset", {}).items():  # a template's values still to be given
            (envs if field == "envs" else secrets)[key] = None
        referred = self.secrets if secret_references else {}
        extra = {
            key: ov.as_references(value, referred, mapping) if key in _SUBSTITUTED_EXTRA else value
            for key, value in extra.items()
        }
        data: dict[str, Any] = {
            "name": self.name,
            "workdir": ov.as_references(workdir, referred, mapping),
            "num_nodes": self.num_nodes,
            "resources": self.resources.to_dict() or None,
            "envs": envs or None,
            "secrets": secrets or None,
            "file_mounts": ov.as_references(mounts, referred, mapping) or None,
            "setup": self.setup,
            "run": self.run,
            **extra,
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
