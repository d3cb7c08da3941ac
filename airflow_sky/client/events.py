"""What the engine tells its listeners (the CLI's live view, the SDK) while a job runs.

Events come from two watchers the engine attaches to a run (client.live): Airflow's task-instance
listener hooks (a task started, succeeded or failed) and a tail of every node's log (its lines as `log`
events, its progress reports as `progress` events: the job's progress document in `data`). The operators and
the gang core publish nothing; a scheduler's worker runs exactly the code the CLI runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Literal

EventKind = Literal[
    "job",
    "task_started",
    "task_done",
    "task_failed",
    "log",
    "exit",
    "result",
    "relaunch",
    "queued",
    "progress",
]


@dataclasses.dataclass(frozen=True)
class Event:
    kind: EventKind
    step: str  # provision, sync, setup_follow, launch, run_follow, collect, teardown
    rank: int | None = None
    text: str = ""
    exit_code: int | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    at: float = dataclasses.field(default_factory=time.time)


Listener = Callable[[Event], None]
