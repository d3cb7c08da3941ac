"""What `launch`/`exec` are given to run, as `sky launch`/`sky exec` read it: a task YAML, or a command.

The positional words are joined with spaces (`launch -c C echo hi` is the command `echo hi`). One word that
ends in `.yaml`/`.yml` is a task file, which must exist; one word naming an existing file that holds a YAML
mapping is a task file too; anything else is a shell command, run as the `run` of a task named `sky-cmd`
(built through `Task.from_dict`, so it is checked and normalized as a YAML task is). No words: nothing to
run (`launch -c C` provisions the cluster only).

The flags that only `launch`/`exec` take over the YAML (`-n/--name`, `--workdir`, `--ports`) are applied
here too, with the meaning sky gives them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Mapping, Sequence

from airflow_sky.errors import SpecError
from airflow_sky.task.schema import NAME_PATTERN
from airflow_sky.task.task import Task
from airflow_sky.task.text_files import read_text_file
from airflow_sky.task.yaml_io import parse_yaml_documents

COMMAND_TASK_NAME = "sky-cmd"  # sky's name for a task made from a command
COMMAND_SOURCE = "<command>"  # what a command task's messages name as their source
YAML_SUFFIXES = (".yaml", ".yml")
_NAME = re.compile(NAME_PATTERN)


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    """Exactly one of `yaml_path` and `command`, or neither (provision only)."""

    yaml_path: str | None = None
    command: str | None = None

    @property
    def label(self) -> str:
        """What messages name: the YAML's path, the command (shell-quoted), or that nothing was given."""
        if self.yaml_path is not None:
            return self.yaml_path
        if self.command is not None:
            return f"command {shlex.quote(self.command)}"
        return "no entrypoint"


def parse_entrypoint(words: Sequence[str]) -> Entrypoint:
    """The positional words of `launch`/`exec` -> a task file, a command, or nothing (see the module)."""
    text = " ".join(words)
    if not text.strip():
        return Entrypoint()
    single = words[0] if len(words) == 1 else None
    if single is not None and single.endswith(YAML_SUFFIXES):
        path = os.path.expanduser(single)
        if not os.path.exists(path):
            raise SpecError(
                f"{single}: no such task YAML (a path ending in .yaml/.yml must be an existing file; "
                "to run a command, give the command itself, e.g. 'python train.py')"
            )
        if not os.path.isfile(path):
            raise SpecError(f"{single}: not a file; give a task YAML or a command")
        return Entrypoint(yaml_path=single)
    if single is not None and _holds_a_task(os.path.expanduser(single)):
        return Entrypoint(yaml_path=single)
    return Entrypoint(command=text)


def _holds_a_task(path: str) -> bool:
    """An existing file whose first YAML document is a mapping (a task file without a .yaml name); a
    script (`./run.sh`) or anything unreadable as YAML is a command, as in sky."""
    if not os.path.isfile(path):
        return False
    try:
        documents = parse_yaml_documents(read_text_file(path), path)
    except SpecError:
        return False
    return bool(documents) and isinstance(documents[0], dict)


def command_task(
    command: str | None,
    *,
    env_overrides: Mapping[str, str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
    allow_unset: bool = False,
) -> Task:
    """The task of a command entrypoint, as `sky launch 'CMD'` builds it: named `sky-cmd`, running CMD,
    default resources; None: a task that runs nothing. Loaded as the YAML `{name: sky-cmd, run: CMD}`
    would be (same checks and defaults), with the launch's env values; paths resolve against the cwd."""
    return Task.from_dict(
        {"name": COMMAND_TASK_NAME, "run": command},
        source=COMMAND_SOURCE,
        base_dir=os.getcwd(),
        env_overrides=env_overrides,
        env_file=env_file,
        allow_unset=allow_unset,
    )


def apply_entrypoint_overrides(
    task: Task,
    *,
    name: str | None = None,
    workdir: str | None = None,
    ports: Sequence[str] = (),
) -> Task:
    """`-n/--name`, `--workdir DIR` and `--ports P` (repeatable) over the task's own, as sky applies them:
    the task's name; a local directory synced as the workdir (relative to the cwd); the ports to open,
    replacing the YAML's (`--ports none` clears them). Returns `task`."""
    if name is not None:
        if not _NAME.match(name):
            raise SpecError(
                f"-n/--name {name!r}: must be letters/digits joined by '.', '_' or '-' (one or two), "
                "e.g. 'minGPT-ddp'"
            )
        task.name = name
    if workdir is not None:
        path = os.path.abspath(os.path.expanduser(workdir))
        if not os.path.isdir(path):
            raise SpecError(f"--workdir {workdir}: not an existing directory (the local folder to sync)")
        task.workdir = path
    if ports:
        task.set_resources(task.resources.copy(ports=_ports(ports)))
    return task


def _ports(ports: Sequence[str]) -> list[str] | None:
    if any(port.strip().lower() == "none" for port in ports):
        if len(ports) > 1:
            raise SpecError("--ports: 'none' clears the ports; it cannot be given with other ports")
        return None
    from airflow_sky.task.diagnostics import SpecContext
    from airflow_sky.task.fields import parse_ports

    parsed: list[str] = []
    for port in ports:
        try:
            parsed += parse_ports(port.strip(), SpecContext("--ports"), [])
        except SpecError:
            raise SpecError(
                f"--ports {port}: must be a port 1..65535 or a range 'LO-HI' (repeat --ports for several)"
            ) from None
    return parsed
