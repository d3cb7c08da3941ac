"""`Resources` (what each node needs, and where) and `JobRecovery` (how a job survives failures)."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.task import fields
from airflow_sky.task.diagnostics import PYTHON_SOURCE, PathPart, SpecContext, format_path
from airflow_sky.task.fields import Count
from airflow_sky.task.schema import (
    INERT_RESOURCE_FIELDS,
    JOB_RECOVERY_STRATEGIES,
    RESOURCES_SCHEMA,
    SINGLE_RESOURCES_SCHEMA,
)
from airflow_sky.task.validate import validate


@dataclasses.dataclass(frozen=True)
class JobRecovery:
    """Recovery policy: `strategy` (FAILOVER, EAGER_NEXT_REGION; None = default), restarts on user errors."""

    strategy: str | None = None
    max_restarts_on_errors: int = 0
    recover_on_exit_codes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        codes = self.recover_on_exit_codes
        object.__setattr__(
            self, "recover_on_exit_codes", (codes,) if isinstance(codes, int) else tuple(codes)
        )
        if isinstance(self.strategy, str):
            object.__setattr__(self, "strategy", self.strategy.strip().upper())
        ctx = SpecContext(PYTHON_SOURCE)
        validate(self.to_dict(), _JOB_RECOVERY_SCHEMA, ctx, ("job_recovery",))
        _check_strategy(self.strategy, ctx, ("job_recovery", "strategy"))

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping, listing only non-default fields."""
        data: dict[str, Any] = {}
        if self.strategy is not None:
            data["strategy"] = self.strategy
        if self.max_restarts_on_errors:
            data["max_restarts_on_errors"] = self.max_restarts_on_errors
        if self.recover_on_exit_codes:
            data["recover_on_exit_codes"] = list(self.recover_on_exit_codes)
        return data


_JOB_RECOVERY_SCHEMA: dict[str, Any] = RESOURCES_SCHEMA["properties"]["job_recovery"]


def _check_strategy(strategy: str | None, ctx: SpecContext, path: Sequence[PathPart]) -> None:
    if strategy is not None and strategy not in JOB_RECOVERY_STRATEGIES:
        allowed = ", ".join(JOB_RECOVERY_STRATEGIES)
        raise ctx.error(path, f"unknown strategy {strategy!r}; allowed: {allowed} (or null for the default)")


def _parse_job_recovery(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> JobRecovery:
    data = {"strategy": value} if isinstance(value, str) else dict(value)
    strategy = data.get("strategy")
    strategy = strategy.strip().upper() if isinstance(strategy, str) else None
    _check_strategy(strategy, ctx, [*path, "strategy"] if not isinstance(value, str) else path)
    codes: Any = data.get("recover_on_exit_codes", ())
    return JobRecovery(
        strategy=strategy,
        max_restarts_on_errors=int(data.get("max_restarts_on_errors", 0)),
        recover_on_exit_codes=(codes,) if isinstance(codes, int) else tuple(codes),
    )


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
    accelerators: dict[str, Count] | None
    accelerators_ordered: bool  # given as a list: try the candidates in that order
    instance_type: str | None
    use_spot: bool | None
    disk_size: int | None
    job_recovery: JobRecovery | None
    ports: tuple[str, ...] | None
    image_id: str | dict[str, Any] | None
    # Parsed and kept, not acted on yet:
    labels: dict[str, str] | None
    disk_tier: str | None
    network_tier: str | None
    autostop: dict[str, Any] | bool | None  # False: off; else {"idle_minutes", "down", "wait_for"}
    accelerator_args: dict[str, Any] | None
    any_of: tuple[Resources, ...]
    ordered: tuple[Resources, ...]

    def __init__(
        self,
        *,
        cpus: int | float | str | None = None,
        memory: int | float | str | None = None,
        accelerators: str | Mapping[str, Count | None] | Sequence[str] | None = None,
        use_spot: bool | None = None,
        instance_type: str | None = None,
        infra: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        disk_size: int | None = None,
        job_recovery: JobRecovery | str | Mapping[str, Any] | None = None,
        ports: int | str | Sequence[int | str] | None = None,
        image_id: str | Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        disk_tier: str | None = None,
        network_tier: str | None = None,
        autostop: Any = None,
        accelerator_args: Mapping[str, Any] | None = None,
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
        config = {key: value for key, value in config.items() if value is not None}
        validate(config, RESOURCES_SCHEMA if top else SINGLE_RESOURCES_SCHEMA, ctx, path)
        self.cloud, self.region, self.zone = fields.parse_infra(config, ctx, path)
        cpus, memory = config.get("cpus"), config.get("memory")
        self.cpus = None if cpus is None else fields.parse_amount(cpus, ctx, [*path, "cpus"], memory=False)
        self.memory = (
            None if memory is None else fields.parse_amount(memory, ctx, [*path, "memory"], memory=True)
        )
        accelerators = config.get("accelerators")
        # SkyPilot: a list of candidates is a preference order; a mapping or set, any (the cheapest).
        self.accelerators_ordered = isinstance(accelerators, list | tuple) and len(accelerators) > 1
        self.accelerators = (
            None
            if accelerators is None
            else fields.parse_accelerators(accelerators, ctx, [*path, "accelerators"])
        )
        self.instance_type = config.get("instance_type")
        self.use_spot = config.get("use_spot")
        self.disk_size = config.get("disk_size")
        recovery = config.get("job_recovery")
        self.job_recovery = (
            None if recovery is None else _parse_job_recovery(recovery, ctx, [*path, "job_recovery"])
        )
        ports = config.get("ports")
        self.ports = None if ports is None else fields.parse_ports(ports, ctx, [*path, "ports"])
        self.image_id = copy.deepcopy(config.get("image_id"))
        self.labels = copy.deepcopy(config.get("labels"))
        self.disk_tier = config.get("disk_tier")
        self.network_tier = config.get("network_tier")
        autostop = config.get("autostop")
        self.autostop = (
            None if autostop is None else fields.parse_autostop(autostop, ctx, [*path, "autostop"])
        )
        self.accelerator_args = copy.deepcopy(config.get("accelerator_args"))
        for key in INERT_RESOURCE_FIELDS:
            if key in config:
                ctx.note_inert([*path, key])
        self.any_of = self._alternatives(config, "any_of", ctx, path)
        self.ordered = self._alternatives(config, "ordered", ctx, path)
        if self.any_of and self.ordered:
            raise ctx.error(
                [*path, "any_of"],
                f"cannot be combined with {format_path([*path, 'ordered'])}; use one of them",
            )
        if self.ordered and self.accelerators and len(self.accelerators) > 1:
            raise ctx.error(
                [*path, "accelerators"], "several accelerator candidates cannot be combined with `ordered`"
            )

    @staticmethod
    def _alternatives(
        config: Mapping[str, Any], key: str, ctx: SpecContext, path: Sequence[PathPart]
    ) -> tuple[Resources, ...]:
        entries = config.get(key) or []
        return tuple(_build(entry, ctx, [*path, key, i], top=False) for i, entry in enumerate(entries))

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML mapping (fields that are set); from_dict(to_dict()) gives an equal object."""
        data: dict[str, Any] = {
            "infra": fields.format_infra(self.cloud, self.region, self.zone),
            "cpus": self.cpus,
            "memory": self.memory,
            "accelerators": fields.format_accelerators(self.accelerators, self.accelerators_ordered)
            if self.accelerators
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
    def accelerator_name(self) -> str | None:
        """Name of the first accelerator candidate (this resource's own, else the first alternative's)."""
        first = self._first_accelerated()
        return next(iter(first.accelerators)) if first and first.accelerators else None

    @property
    def accelerator_count(self) -> Count:
        """Count of the first accelerator candidate; 0 without accelerators. May be fractional (0.5)."""
        first = self._first_accelerated()
        return next(iter(first.accelerators.values())) if first and first.accelerators else 0

    def _first_accelerated(self) -> Resources | None:
        return next((r for r in self.candidates() if r.accelerators), None)

    def candidates(self) -> list[Resources]:
        """Each concrete alternative: any_of/ordered entries merged over this one, one per accelerator.

        For `ordered` the list is in preference order; for the rest any candidate will do.
        """
        merged = [self._merged(alt) for alt in (self.any_of or self.ordered)] or [self._bare()]
        result: list[Resources] = []
        for resource in merged:
            if not resource.accelerators or len(resource.accelerators) == 1:
                result.append(resource)
                continue
            for name, count in resource.accelerators.items():
                single = copy.copy(resource)
                single.accelerators = {name: count}
                result.append(single)
        return result

    def _bare(self) -> Resources:
        bare = copy.copy(self)
        bare.any_of, bare.ordered = (), ()
        return bare

    def _merged(self, alternative: Resources) -> Resources:
        merged = self._bare()
        for key, value in vars(alternative).items():
            if key == "accelerators_ordered" and alternative.accelerators is None:
                continue  # the order belongs to the accelerators it came with
            if value is not None and key not in ("any_of", "ordered"):
                setattr(merged, key, copy.deepcopy(value))
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
    if isinstance(result.get("job_recovery"), JobRecovery):
        result["job_recovery"] = result["job_recovery"].to_dict()
    for key in ("any_of", "ordered"):
        if key in result:
            result[key] = [r.to_dict() if isinstance(r, Resources) else dict(r) for r in result[key]]
    for key in ("accelerators", "ports"):
        if isinstance(result.get(key), tuple | set | frozenset):
            result[key] = list(result[key])
    for key in ("image_id", "labels", "accelerator_args", "accelerators"):
        if isinstance(result.get(key), Mapping):
            result[key] = dict(result[key])
    return result


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
