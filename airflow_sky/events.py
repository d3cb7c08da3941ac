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


def subscribe(listener: Listener) -> Callable[[], None]:
    """Register `listener`; returns the function that unregisters it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def publish(event: Event) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)
