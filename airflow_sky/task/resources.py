"""`Resources`: what each node of a task needs, and where it may run."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.task import fields
from airflow_sky.task.diagnostics import PYTHON_SOURCE, PathPart, SpecContext, format_path
from airflow_sky.task.fields import Count
from airflow_sky.task.job_recovery import JobRecovery, parse_job_recovery
from airflow_sky.task.resources_config import refuse_internal, resolve_alias, without_nulls
from airflow_sky.task.schema import (
    INERT_RESOURCE_FIELDS,
    RESOURCES_SCHEMA,
    SINGLE_RESOURCES_SCHEMA,
)
from airflow_sky.task.validate import validate


class Resources:
    """What each node of a task needs and where it may run; values are validated and canonical.

    Build it from Python keywords (like `sky.Resources`) or from a YAML mapping with `Resources.from_dict`.
    `any_of`/`ordered` hold alternatives (fields override this one's); see `candidates()`.
    """

    cloud: str | None
    region: str | None
    zone: str | None
    cpus: str | None
    memory: str | None
    _accelerators: fields.Accelerators | None  # (name, count) candidates; see accelerator_candidates
    accelerators_ordered: bool  # given as a list: try the candidates in that order
    instance_type: str | None
    use_spot: bool | None
    disk_size: int | None  # GB
    job_recovery: JobRecovery | None
    ports: tuple[str, ...] | None
    image_id: str | dict[str, Any] | None
    labels: dict[str, str] | None
    disk_tier: str | None
    network_tier: str | None
    autostop: dict[str, Any] | bool | None  # False: off; else {"idle_minutes", "down", "wait_for"}
    # Parsed and kept, not acted on yet:
    accelerator_args: dict[str, Any] | None
    priority: int | None
    volumes: list[dict[str, Any]] | None
    any_of: tuple[Resources, ...]
    ordered: tuple[Resources, ...]

    def __init__(
        self,
        *,
        cpus: int | float | str | None = None,
        memory: int | float | str | None = None,
        accelerators: str | Mapping[str, Count | None] | Sequence[str] | None = None,
        gpus: str | Mapping[str, Count | None] | Sequence[str] | None = None,
        spot_recovery: JobRecovery | str | Mapping[str, Any] | None = None,
        use_spot: bool | None = None,
        instance_type: str | None = None,
        infra: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        disk_size: int | str | None = None,
        job_recovery: JobRecovery | str | Mapping[str, Any] | None = None,
        ports: int | str | Sequence[int | str] | None = None,
        image_id: str | Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        disk_tier: str | None = None,
        network_tier: str | None = None,
        autostop: Any = None,
        accelerator_args: Mapping[str, Any] | None = None,
        priority: int | None = None,
        volumes: Sequence[Mapping[str, Any]] | None = None,
        any_of: Sequence[Resources | Mapping[str, Any]] | None = None,
        ordered: Sequence[Resources | Mapping[str, Any]] | None = None,
    ):
        config = {key: value for key, value in locals().items() if key != "self" and value is not None}
        ctx = SpecContext(PYTHON_SOURCE)
        self._load(_python_config(config), ctx, ("resources",), top=True)
        ctx.warn_inert()

    @classmethod
    def from_dict(
        cls,
        config: Mapping[str, Any],
        *,
        source: str = PYTHON_SOURCE,
        path: Sequence[PathPart] = ("resources",),
    ) -> Resources:
        """Validate a YAML-style mapping; problems name `source` and `path`. Warns about inert fields."""
        ctx = SpecContext(source)
        resources = build_resources(config, ctx, path)
        ctx.warn_inert()
        return resources

    def _load(
        self, config: Mapping[str, Any], ctx: SpecContext, path: Sequence[PathPart], *, top: bool
    ) -> None:
        config = without_nulls(config)
        refuse_internal(config, ctx, path)
        validate(config, RESOURCES_SCHEMA if top else SINGLE_RESOURCES_SCHEMA, ctx, path)
        config = resolve_alias(config, "gpus", "accelerators", ctx, path)
        config = resolve_alias(config, "spot_recovery", "job_recovery", ctx, path)
        self.cloud, self.region, self.zone = fields.parse_infra(config, ctx, path)
        cpus, memory = config.get("cpus"), config.get("memory")
        self.cpus = None if cpus is None else fields.parse_amount(cpus, ctx, [*path, "cpus"], memory=False)
        self.memory = (
            None if memory is None else fields.parse_amount(memory, ctx, [*path, "memory"], memory=True)
        )
        accelerators = config.get("accelerators")
        # SkyPilot: a list of candidates is a preference order; a mapping or set, any (the cheapest).
        self._accelerators = (
            None
            if accelerators is None
            else fields.parse_accelerators(accelerators, ctx, [*path, "accelerators"])
        )
        self.accelerators_ordered = (
            isinstance(accelerators, list | tuple) and len(self._accelerators or ()) > 1
        )
        self.instance_type = config.get("instance_type")
        self.use_spot = config.get("use_spot")
        disk_size = config.get("disk_size")
        self.disk_size = (
            None if disk_size is None else fields.parse_disk_size(disk_size, ctx, [*path, "disk_size"])
        )
        recovery = config.get("job_recovery")
        self.job_recovery = (
            None if recovery is None else parse_job_recovery(recovery, ctx, [*path, "job_recovery"])
        )
        ports = config.get("ports")
        self.ports = None if ports is None else fields.parse_ports(ports, ctx, [*path, "ports"])
        self.image_id = copy.deepcopy(config.get("image_id"))
        self.labels = copy.deepcopy(config.get("labels"))
        self.disk_tier = _tier(config, "disk_tier", fields.DISK_TIERS, ctx, path)
        self.network_tier = _tier(config, "network_tier", fields.NETWORK_TIERS, ctx, path)
        autostop = config.get("autostop")
        self.autostop = (
            None if autostop is None else fields.parse_autostop(autostop, ctx, [*path, "autostop"])
        )
        self.accelerator_args = copy.deepcopy(config.get("accelerator_args"))
        self.priority = config.get("priority")
        self.volumes = copy.deepcopy(config.get("volumes"))
        for key in INERT_RESOURCE_FIELDS:
            if key in config:
                ctx.note_inert([*path, key])
        if isinstance(self.autostop, dict) and "hook" in self.autostop:
            ctx.note_inert([*path, "autostop", "hook"])
        self.any_of = self._alternatives(config, "any_of", ctx, path)
        self.ordered = self._alternatives(config, "ordered", ctx, path)
        if self.any_of and self.ordered:
            raise ctx.error(
                [*path, "any_of"],
                f"cannot be combined with {format_path([*path, 'ordered'])}; use one of them",
            )
        if self.ordered and self._accelerators and len(self._accelerators) > 1:
            raise ctx.error(
                [*path, "accelerators"], "several accelerator candidates cannot be combined with `ordered`"
            )
        if self.any_of and self.accelerators_ordered:
            raise ctx.error(
                [*path, "accelerators"],
                "a list of accelerators (an order of preference) cannot be combined with `any_of`; "
                "give them as a set {A: n, B: m}",
            )

    @staticmethod
    def _alternatives(
        config: Mapping[str, Any], key: str, ctx: SpecContext, path: Sequence[PathPart]
    ) -> tuple[Resources, ...]:
        entries = config.get(key) or []
        # SkyPilot's optimizer skips candidates on clouds it cannot use; so do we, naming each once. Only
        # when none is left is it an error (the first one's, which says what is supported).
        usable = [(i, e) for i, e in enumerate(entries) if fields.entry_cloud_supported(e)]
        for i, entry in enumerate(entries):
            if (i, entry) not in usable:
                ctx.note_inert(
                    [*path, key, f"{i} ({fields.entry_cloud(entry)}: not a supported cloud, skipped)"]
                )
        if entries and not usable:
            usable = list(enumerate(entries))
        return tuple(_build(entry, ctx, [*path, key, i], top=False) for i, entry in usable)

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML mapping (fields that are set); from_dict(to_dict()) gives an equal object."""
        data: dict[str, Any] = {
            "infra": fields.format_infra(self.cloud, self.region, self.zone),
            "cpus": self.cpus,
            "memory": self.memory,
            "accelerators": fields.format_accelerators(self._accelerators, self.accelerators_ordered)
            if self._accelerators
            else None,
            "instance_type": self.instance_type,
            "use_spot": self.use_spot,
            "disk_size": self.disk_size,
            "job_recovery": self.job_recovery.to_dict() if self.job_recovery else None,
            "ports": list(self.ports) if self.ports is not None else None,
            "image_id": copy.deepcopy(self.image_id),
            "labels": copy.deepcopy(self.labels),
            "disk_tier": self.disk_tier,
            "network_tier": self.network_tier,
            "autostop": copy.deepcopy(self.autostop),
            "accelerator_args": copy.deepcopy(self.accelerator_args),
            "priority": self.priority,
            "volumes": copy.deepcopy(self.volumes),
            "any_of": [r.to_dict() for r in self.any_of] or None,
            "ordered": [r.to_dict() for r in self.ordered] or None,
        }
        return {key: value for key, value in data.items() if value is not None}

    def copy(self, **overrides: Any) -> Resources:
        """A new Resources with some fields replaced (Python keywords, validated like the constructor)."""
        config = self.to_dict()
        if any(key in overrides for key in ("cloud", "region", "zone")):
            config.pop("infra", None)
        config.update(overrides)
        return Resources(**config)

    @property
    def infra(self) -> str | None:
        """'cloud[/region[/zone]]', or None when no placement was asked for."""
        return fields.format_infra(self.cloud, self.region, self.zone)

    @property
    def accelerators(self) -> dict[str, Count] | None:
        """{name: count} of the accelerator candidates (a GPU given at several counts: its first count;
        `accelerator_candidates` has them all)."""
        if not self._accelerators:
            return None
        result: dict[str, Count] = {}
        for name, count in self._accelerators:
            result.setdefault(name, count)
        return result

    @accelerators.setter
    def accelerators(self, value: Mapping[str, Count] | None) -> None:
        self._accelerators = None if value is None else tuple(value.items())

    @property
    def accelerator_candidates(self) -> tuple[tuple[str, Count], ...]:
        """Every (name, count) accelerator candidate, in the given order; () without accelerators."""
        return self._accelerators or ()

    @property
    def accelerator_name(self) -> str | None:
        """Name of the first accelerator candidate (this resource's own, else the first alternative's)."""
        first = self._first_accelerated()
        return first.accelerator_candidates[0][0] if first and first._accelerators else None

    @property
    def accelerator_count(self) -> Count:
        """Count of the first accelerator candidate; 0 without accelerators. May be fractional (0.5)."""
        first = self._first_accelerated()
        return first.accelerator_candidates[0][1] if first and first._accelerators else 0

    def _first_accelerated(self) -> Resources | None:
        return next((r for r in self.candidates() if r._accelerators), None)

    def candidates(self) -> list[Resources]:
        """Each concrete alternative: any_of/ordered entries merged over this one, one per accelerator.

        For `ordered` the list is in preference order; for the rest any candidate will do.
        """
        merged = [self._merged(alt) for alt in (self.any_of or self.ordered)] or [self._bare()]
        result: list[Resources] = []
        for resource in merged:
            if not resource._accelerators or len(resource._accelerators) == 1:
                result.append(resource)
                continue
            for candidate in resource._accelerators:
                single = copy.copy(resource)
                single._accelerators = (candidate,)
                result.append(single)
        return result

    def _bare(self) -> Resources:
        bare = copy.copy(self)
        bare.any_of, bare.ordered = (), ()
        return bare

    def _merged(self, alternative: Resources) -> Resources:
        merged = self._bare()
        for key, value in vars(alternative).items():
            if key == "accelerators_ordered" and alternative._accelerators is None:
                continue  # the order belongs to the accelerators it came with
            if value is not None and key not in ("any_of", "ordered"):
                setattr(merged, key, copy.deepcopy(value))
        if self.labels and alternative.labels:  # SkyPilot merges labels (the alternative's win)
            merged.labels = {**self.labels, **alternative.labels}
        if alternative.cloud is not None:  # a cloud in the alternative replaces the whole placement
            merged.region, merged.zone = alternative.region, alternative.zone
        return merged

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resources) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable; equality is by value

    def __repr__(self) -> str:
        fields_text = ", ".join(f"{key}={value!r}" for key, value in self.to_dict().items())
        return f"Resources({fields_text})"


def _python_config(config: dict[str, Any]) -> dict[str, Any]:
    """Python-only values (JobRecovery, Resources, tuples) -> the YAML mapping shape the schema checks."""
    result = dict(config)
    for key in ("job_recovery", "spot_recovery"):
        if isinstance(result.get(key), JobRecovery):
            result[key] = result[key].to_dict()
    for key in ("any_of", "ordered"):
        if key in result:
            result[key] = [r.to_dict() if isinstance(r, Resources) else dict(r) for r in result[key]]
    for key in ("accelerators", "gpus", "ports"):
        if isinstance(result.get(key), tuple | set | frozenset):
            result[key] = list(result[key])
    if "volumes" in result:
        result["volumes"] = [dict(volume) for volume in result["volumes"]]
    for key in ("image_id", "labels", "accelerator_args", "accelerators", "gpus"):
        if isinstance(result.get(key), Mapping):
            result[key] = dict(result[key])
    return result


def _tier(
    config: Mapping[str, Any], key: str, allowed: Sequence[str], ctx: SpecContext, path: Sequence[PathPart]
) -> str | None:
    value = config.get(key)
    return None if value is None else fields.parse_tier(value, allowed, ctx, [*path, key])


def _build(config: Any, ctx: SpecContext, path: Sequence[PathPart], *, top: bool) -> Resources:
    resources = Resources.__new__(Resources)
    if not isinstance(config, Mapping):
        validate(config, RESOURCES_SCHEMA if top else SINGLE_RESOURCES_SCHEMA, ctx, path)
    resources._load(config, ctx, path, top=top)
    return resources


def build_resources(config: Any, ctx: SpecContext, path: Sequence[PathPart] = ("resources",)) -> Resources:
    """Validate a YAML mapping into Resources, noting inert fields in `ctx` (the caller warns once)."""
    return _build(config, ctx, path, top=True)


def gpus_per_node(resources: Resources | None) -> int:
    """SKYPILOT_NUM_GPUS_PER_NODE: the ceiling of the first candidate's accelerator count, 0 without GPUs."""
    return 0 if resources is None else math.ceil(resources.accelerator_count)
