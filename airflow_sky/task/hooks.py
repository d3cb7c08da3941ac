"""Lifecycle hooks (SkyPilot's `config.hooks`, v0.13): scripts that run on the cluster's nodes before it is
stopped, before it is torn down, and when a node is about to be preempted. Pure rules, nothing runs here.

    config:
      hooks:
        - run: git -C ~/sky_workdir push      # required: a shell script
          events: [stop, down]                # optional: a subset of stop, preemption, down (default all)
          timeout: 120                        # optional: seconds, >= 1 (default 3600)

Hooks of one event run in declaration order; one that fails or runs out of time is a warning and the event
goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from airflow_sky.errors import SpecError

HookEvent = Literal["stop", "preemption", "down"]
EVENTS: tuple[HookEvent, ...] = ("stop", "preemption", "down")
DEFAULT_TIMEOUT_S = 3600
_FIELDS = ("run", "events", "timeout")


@dataclasses.dataclass(frozen=True)
class LifecycleHook:
    run: str
    events: tuple[HookEvent, ...] = EVENTS
    timeout: int = DEFAULT_TIMEOUT_S

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "events": list(self.events), "timeout": self.timeout}


def parse_hooks(value: Any, source: str = "config.hooks") -> tuple[LifecycleHook, ...]:
    """`config.hooks` as written (None: no hooks); a wrong entry raises SpecError naming its field."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(f"{source}: must be a list of hooks, e.g. [{{run: 'echo bye', events: [down]}}]")
    return tuple(_hook(entry, f"{source}[{i}]") for i, entry in enumerate(value))


def _hook(entry: Any, where: str) -> LifecycleHook:
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: must be a mapping {{run, events, timeout}}, got {type(entry).__name__}")
    unknown = sorted(str(key) for key in entry if key not in _FIELDS)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; a hook has {', '.join(_FIELDS)}")
    run = entry.get("run")
    if not isinstance(run, str) or not run.strip():
        raise SpecError(f"{where}.run: required, a non-empty shell script")
    events = entry.get("events", list(EVENTS))
    if not isinstance(events, list) or not events:
        raise SpecError(f"{where}.events: must be a non-empty list of {', '.join(EVENTS)}")
    for i, event in enumerate(events):
        if event not in EVENTS:
            raise SpecError(f"{where}.events[{i}]: {event!r} is no event; one of {', '.join(EVENTS)}")
    timeout = entry.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise SpecError(f"{where}.timeout: must be a whole number of seconds >= 1, got {timeout!r}")
    ordered = tuple(e for e in EVENTS if e in events)  # each once
    return LifecycleHook(run=run, events=cast(tuple[HookEvent, ...], ordered), timeout=timeout)


def hooks_config(config: Any) -> Any:
    """`config.hooks` of a task's `config` field (None without one)."""
    return config.get("hooks") if isinstance(config, dict) else None


def for_event(hooks: Sequence[LifecycleHook], event: HookEvent) -> list[LifecycleHook]:
    """The hooks that run on `event`, in declaration order."""
    return [hook for hook in hooks if event in hook.events]


def hooks_from_dicts(data: Any) -> tuple[LifecycleHook, ...]:
    """Hooks as a job record keeps them (`to_dict`); entries it cannot read are skipped, not fatal: a stop
    or a down must go on whatever a record holds."""
    try:
        return parse_hooks(data, "recorded hooks")
    except SpecError:
        return ()


HOOK_EVENT_ENV = "AIRFLOW_SKY_HOOK_EVENT"  # stop, preemption or down: one script can serve several events


def hook_env(
    user: Mapping[str, str],
    node_ips: Sequence[str],
    rank: int,
    cluster_info: str,
    task_id: str,
    event: HookEvent,
) -> dict[str, str]:
    """A hook's env on the node of `rank`: the task's envs (and secrets, where the caller has them), the
    cluster's SKYPILOT_* as a run sees them, and the event."""
    return {
        **user,
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(node_ips),
        "SKYPILOT_NUM_NODES": str(len(node_ips)),
        "SKYPILOT_TASK_ID": task_id,
        "SKYPILOT_CLUSTER_INFO": cluster_info,
        "PYTHONUNBUFFERED": "1",
        HOOK_EVENT_ENV: event,
    }
