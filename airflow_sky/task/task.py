"""`Task`: a SkyPilot-style job (setup, run, envs, workdir, file_mounts, resources, num_nodes)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import inspect
import os
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

from airflow_sky.errors import SpecError
from airflow_sky.task import overrides as ov
from airflow_sky.task.diagnostics import (
    PYTHON_SOURCE,
    STRING_SOURCE,
    SpecContext,
    show,
    unknown_field_message,
)
from airflow_sky.task.redaction import redact_json, redactor
from airflow_sky.task.resources import JobRecovery, Resources, build_resources
from airflow_sky.task.schema import (
    BUCKET_URI_SCHEMES,
    INERT_TASK_FIELDS,
    INTERNAL_STORAGE_FIELDS,
    INTERNAL_TASK_FIELDS,
    STORAGE_SCHEMA,
    TASK_SCHEMA,
)
from airflow_sky.task.text_files import read_text_file
from airflow_sky.task.validate import validate
from airflow_sky.task.yaml_io import dump_yaml, parse_yaml

P = ParamSpec("P")

REDACTED = "<redacted>"
WORKDIR_ON_NODE = "sky_workdir"  # ~/sky_workdir, where the workdir lands on every node
_SUBSTITUTED_EXTRA = ("service", "volumes")  # inert fields SkyPilot fills envs into
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
    config: dict[str, Any] | None = None  # SkyPilot's volume settings; kept, not acted on

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
    def from_dict(
        cls,
        config: Any,
        *,
        source: str = PYTHON_SOURCE,
        base_dir: str | None = None,
        env_overrides: Mapping[str, str] | None = None,
        env_file: str | os.PathLike[str] | None = None,
        allow_unset: bool = False,
    ) -> Task:
        """Validate a task mapping (a parsed YAML document). Warns once (SpecWarning) about inert fields.

        `allow_unset`: a template check: envs/secrets left null (no launch value) are listed in `task.unset`
        instead of being an error; such a task is not launchable.
        """
        file_values = ov.read_env_file(env_file) if env_file is not None else None
        task = cls.__new__(cls)
        ctx = SpecContext(source)
        task._load(
            config,
            ctx,
            base_dir=base_dir,
            overrides=ov.merge_overrides(env_overrides, file_values),
            allow_unset=allow_unset,
        )
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
        allow_unset: bool = False,
    ) -> Task:
        """Parse YAML text (with yaml.safe_load rules); see `from_dict`."""
        config = parse_yaml(text, source)
        return cls.from_dict(
            config,
            source=source,
            base_dir=base_dir,
            env_overrides=env_overrides,
            env_file=env_file,
            allow_unset=allow_unset,
        )

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
        source = os.fspath(path)
        text = read_text_file(path)
        base_dir = os.path.dirname(os.path.abspath(source))
        return cls.from_yaml_str(
            text,
            source=source,
            base_dir=base_dir,
            env_overrides=env_overrides,
            env_file=env_file,
            allow_unset=allow_unset,
        )

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
            _refuse_internal(config, ctx)
            config = _env_scalars_as_strings(config)
        validate(config, TASK_SCHEMA, ctx)
        self.base_dir = base_dir
        envs, secrets = ov.apply_overrides(config.get("envs", {}), config.get("secrets", {}), overrides)
        self.unset = {key: "envs" for key, value in envs.items() if value is None} if allow_unset else {}
        self.unset |= {key: "secrets" for key, value in secrets.items() if value is None and allow_unset}
        self.envs = _env_values({k: v for k, v in envs.items() if k not in self.unset}, "envs", ctx)
        self.secrets = _env_values({k: v for k, v in secrets.items() if k not in self.unset}, "secrets", ctx)
        self.name = config.get("name")
        self._num_nodes = config.get("num_nodes", 1)
        self.setup = _script(config.get("setup"))
        self.run = _script(config.get("run"))
        try:
            self._load_substituted(config, ctx)
        except SpecError as e:  # a message may quote a value that a secret was substituted into
            raise SpecError(self.hide_secrets(str(e))) from None
        for key in self.extra_fields:
            ctx.note_inert([key])
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
        self.file_mounts = _file_mounts(config.get("file_mounts", {}), mapping, ctx, unset=tuple(self.unset))
        self.resources = build_resources(config.get("resources", {}), ctx)
        # SkyPilot also fills envs into `service` and `volumes` (kept, not acted on).
        self.extra_fields = {
            key: ov.substitute(copy.deepcopy(config[key]), mapping)
            if key in _SUBSTITUTED_EXTRA
            else copy.deepcopy(config[key])
            for key in INERT_TASK_FIELDS
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
        """Add or replace envs (validated like the YAML's); returns self."""
        self.envs.update(_env_values(_validated_env_map(envs, "envs"), "envs", SpecContext()))
        return self

    def update_secrets(self, secrets: Mapping[str, str | int | float]) -> Task:
        """Add or replace secrets (validated like the YAML's); returns self."""
        self.secrets.update(_env_values(_validated_env_map(secrets, "secrets"), "secrets", SpecContext()))
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


def _script(value: str | list[str] | None) -> str | None:
    return "\n".join(value) if isinstance(value, list) else value


def _validated_env_map(values: Mapping[str, Any], field: str) -> dict[str, Any]:
    config = {field: dict(values)}
    validate(config, TASK_SCHEMA, SpecContext())
    return config[field]


def launch_hint(key: str, field: str) -> str:
    """How a launch gives a value to an env or a secret declared null in the YAML."""
    if field == "secrets":
        return f"--secret {key}=VALUE (or --secret {key} to take it from this shell's environment, or in --secret-file)"
    return f"--env {key}=VALUE (or in --env-file)"


def _env_values(values: Mapping[str, Any], field: str, ctx: SpecContext) -> dict[str, str]:
    """Schema-checked env values -> strings (numbers as written); a null left unset at launch is an error."""
    result: dict[str, str] = {}
    for key, value in values.items():
        if value is None:
            raise ctx.error([field, key], f"has no value; pass it at launch with {launch_hint(key, field)}")
        result[key] = value if isinstance(value, str) else str(value)
    return result


def _file_mounts(
    mounts: dict[str, Any], envs: Mapping[str, str], ctx: SpecContext, unset: Sequence[str] = ()
) -> dict[str, FileMountSource]:
    """file_mounts, `$VAR`s substituted -> {remote path: local path/URI or StorageMount}.

    As in SkyPilot, a storage mapping is checked after substitution (`store: $STORE`); in a template
    (`unset`: names still without a value) a storage field that uses one is not checked yet.
    """
    result: dict[str, FileMountSource] = {}
    for raw_dst, raw_src in mounts.items():
        dst, src = ov.substitute(raw_dst, envs), ov.substitute(raw_src, envs)
        path = ["file_mounts", dst]
        if not dst.strip() or dst.strip() == "~":
            raise ctx.error(path, f"remote path must be a path below / or ~/, got {show(dst)}")
        if ".." in dst.split("/"):
            raise ctx.error(
                path,
                "remote path must not contain '..' (it could land outside the node's home or workdir); "
                f"give an absolute path (/data/x), a path below ~ (~/x) or a path in the workdir (x, "
                f"which lands in ~/{WORKDIR_ON_NODE}/x)",
            )
        if not (dst.startswith("/") or dst.startswith("~/")):
            # As in SkyPilot: a relative remote path is below the workdir.
            dst = posixpath.normpath(f"~/{WORKDIR_ON_NODE}/{dst}")
        if dst in result:
            raise ctx.error(path, f"remote path given twice (as {raw_dst!r} after $VAR substitution)")
        if isinstance(src, str):
            result[dst] = _mount_source(src, ctx, path)
            continue
        validate({k: v for k, v in src.items() if not _uses(v, unset)}, STORAGE_SCHEMA, ctx, path)
        if "name" not in src and "source" not in src:
            raise ctx.error(path, "a storage mapping needs a `name` (bucket) or a `source`")
        if str(src.get("store", "")).lower() == "volume":
            raise ctx.error(
                [*path, "store"],
                "SkyPilot volumes (store: volume, a disk created on the node) are not supported; "
                "use a bucket store or a local path",
            )
        source = src.get("source")
        if isinstance(source, str):
            _mount_source(source, ctx, [*path, "source"])
        result[dst] = StorageMount(
            name=src.get("name"),
            source=tuple(source) if isinstance(source, list) else source,
            store=src["store"].lower() if "store" in src else None,
            mode=src["mode"].upper() if "mode" in src else None,
            persistent=src.get("persistent"),
            config=copy.deepcopy(src.get("config")),
        )
    return result


def _uses(value: Any, names: Sequence[str]) -> bool:
    """Whether a string still refers to one of `names` as $NAME or ${NAME}."""
    return isinstance(value, str) and any(re.search(rf"\$(?:{n}\b|\{{{n}\}})", value) for n in names)


def _mount_source(src: str, ctx: SpecContext, path: Sequence[Any]) -> str:
    if not src.strip():
        raise ctx.error(path, "must be a local path, a bucket URI or a storage mapping, got an empty string")
    match = _URI.match(src)
    if match and match["scheme"].lower() not in BUCKET_URI_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in BUCKET_URI_SCHEMES)
        raise ctx.error(path, f"unsupported URI scheme {match['scheme']!r}; supported: {schemes}")
    return src


def _refuse_internal(config: Mapping[str, Any], ctx: SpecContext) -> None:
    """SkyPilot-internal fields (in the task and its storage mappings) are refused with that reason."""
    for key in config:
        if key in INTERNAL_TASK_FIELDS:
            raise ctx.error([key], "SkyPilot-internal field (SkyPilot writes it for itself); remove it")
    mounts = config.get("file_mounts")
    for dst, src in mounts.items() if isinstance(mounts, dict) else ():
        for key in src if isinstance(src, dict) else ():
            if key in INTERNAL_STORAGE_FIELDS:
                raise ctx.error(
                    ["file_mounts", dst, key],
                    "SkyPilot-internal field (SkyPilot writes it for itself); remove it",
                )


def _env_scalars_as_strings(config: dict[str, Any]) -> dict[str, Any]:
    """As SkyPilot: a non-null env/secret scalar becomes its Python string (`true` -> 'True', a date ->
    '2024-01-01'); numbers keep the schema's number type and become strings later, lists/mappings stay
    for the schema to refuse."""
    result = dict(config)
    for field in ("envs", "secrets"):
        values = result.get(field)
        if isinstance(values, dict):
            result[field] = {
                key: str(value) if isinstance(value, bool | datetime.date) else value
                for key, value in values.items()
            }
    return result
