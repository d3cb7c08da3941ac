"""One launch described once: the task, where it runs and how (LaunchOptions), immutable.

The CLI and the SDK build it; the engine runs it; it crosses a process boundary (the engine's child, the
background engine of a queued exec, the launch DAG file that Airflow parses) only as `to_json`, and is read
back there by `from_json`: one serializer, used nowhere inside a process.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from airflow_sky.task.task import Task


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    cluster_name: str  # normalized (client.cluster_names); "" only in a sky_job DAG: one per DAG run
    infra: str = "local"
    down: bool = True
    setup: bool = True  # False: `exec` and `launch --no-setup`
    must_exist: bool = False  # True: `exec` runs only on a cluster that is already up
    retry_until_up: bool = False  # `--retry-until-up`: no capacity anywhere is retried, not a failure
    follow: bool = True  # False: `--detach-run`, the launch returns once the run started
    # A pipeline's job (the CLI runs each as a launch of its own): the pipeline's name, the job's index,
    # and every task's name and SKYPILOT_TASK_ID (SKYPILOT_TASK_IDS).
    pipeline_name: str | None = None
    pipeline_index: int = 0
    pipeline_task_names: tuple[str, ...] = ()
    pipeline_task_ids: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchOptions:
        options = cls(**data)
        return dataclasses.replace(  # JSON has lists
            options,
            pipeline_task_names=tuple(options.pipeline_task_names),
            pipeline_task_ids=tuple(options.pipeline_task_ids),
        )


@dataclasses.dataclass(frozen=True)
class Launch:
    """A task and its LaunchOptions. The task (secrets included) travels whole: `to_json` is for a pipe
    or a 0600 file, never a command line or a log."""

    task: Task
    options: LaunchOptions

    def to_json(self) -> str:
        return json.dumps(
            {
                "task": self.task.to_dict(),
                "base_dir": self.task.base_dir,
                "options": dataclasses.asdict(self.options),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Launch:
        data = json.loads(text)
        task = Task.from_dict(data["task"], base_dir=data["base_dir"])
        return cls(task, LaunchOptions.from_dict(data["options"]))
