"""How the CLI states an autostop: the idle limit the nodes really apply, which may be more than asked."""

from __future__ import annotations

from airflow_sky.node.autostop import limit_s


def idle_limit_text(asked_minutes: int, check_s: float, down: bool) -> str:
    """'its nodes stop themselves after 2 idle minutes (...)': the watcher's limit for `-i asked_minutes`
    when it looks every `check_s`, and why when that is more than asked (its floor: two of its rounds)."""
    limit = limit_s(asked_minutes * 60, check_s)
    text = f"its nodes {'end' if down else 'stop'} themselves after {_idle(limit)}"
    if limit > asked_minutes * 60:
        text += (
            f" (-i {asked_minutes} is raised to the shortest limit: two of the idle checks each node makes "
            f"every {check_s:g} s)"
        )
    return text


def _idle(seconds: int) -> str:
    if seconds % 60:
        return f"{seconds} idle second{'s' if seconds != 1 else ''}"
    minutes = seconds // 60
    return f"{minutes} idle minute{'s' if minutes != 1 else ''}"
