"""`JobRecovery`: how a job survives failures (SkyPilot's `job_recovery` of the resources)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from airflow_sky.task.diagnostics import PYTHON_SOURCE, PathPart, SpecContext
from airflow_sky.task.schema import JOB_RECOVERY_STRATEGIES, RESOURCES_SCHEMA
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


def parse_job_recovery(value: Any, ctx: SpecContext, path: Sequence[PathPart]) -> JobRecovery | None:
    """A strategy name or mapping -> JobRecovery; strategy `none` (SkyPilot: no policy given) -> None."""
    data = {"strategy": value} if isinstance(value, str) else dict(value)
    strategy = data.get("strategy")
    strategy = strategy.strip().upper() if isinstance(strategy, str) else None
    if strategy == "NONE":
        return None  # SkyPilot drops the whole policy (restarts and exit codes too) for `none`
    _check_strategy(strategy, ctx, [*path, "strategy"] if not isinstance(value, str) else path)
    codes: Any = data.get("recover_on_exit_codes", ())
    return JobRecovery(
        strategy=strategy,
        max_restarts_on_errors=int(data.get("max_restarts_on_errors", 0)),
        recover_on_exit_codes=(codes,) if isinstance(codes, int) else tuple(codes),
    )
