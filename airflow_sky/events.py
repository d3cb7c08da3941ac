"""In-process progress events from the operators, for the CLI and SDK (the Airflow task log is unaffected).

Operators publish; `airflow-sky launch` subscribes to print node-prefixed logs and phase progress live.
With no subscriber (a scheduler's worker), publishing costs one empty loop.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

EventKind = Literal["job", "task_started", "task_done", "task_failed", "log", "exit"]


@dataclasses.dataclass(frozen=True)
class Event:
    kind: EventKind
    step: str  # provision, sync, setup_start, setup_follow, launch, run_start, run_follow, collect, teardown
    rank: int | None = None
    text: str = ""
    exit_code: int | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    at: float = dataclasses.field(default_factory=time.time)


Listener = Callable[[Event], None]
_listeners: list[Listener] = []
_lock = threading.Lock()
_lines_published: dict[tuple[Any, ...], int] = {}  # log stream -> how many of its lines went out


def subscribe(listener: Listener) -> Callable[[], None]:
    """Register `listener`; returns the function that unregisters it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)
            if not _listeners:
                _lines_published.clear()

    return unsubscribe


def publish(event: Event) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)


def has_listeners() -> bool:
    with _lock:
        return bool(_listeners)


def publish_line(stream: tuple[Any, ...], number: int, event: Event) -> None:
    """Publish log line `number` (0-based) of `stream` unless it went out already.

    Several followers may read the same node's log (each follower also tails its siblings for the CLI);
    lines are numbered from the start of the log, so each one reaches the listeners once, in order.
    """
    with _lock:
        if not _listeners or number < _lines_published.get(stream, 0):
            return
        _lines_published[stream] = number + 1
    publish(event)
