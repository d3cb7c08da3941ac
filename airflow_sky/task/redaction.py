"""Secret values out of text: what a task's secrets must never appear as in a log line or an error."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol


class EnvsAndSecrets(Protocol):
    """What redaction reads of a Task (typed by shape: task.py uses this module, not the other way)."""

    @property
    def envs(self) -> Mapping[str, str]: ...

    @property
    def secrets(self) -> Mapping[str, str]: ...


# Parts of a name that make its value a secret: the defaults of Airflow's own masker
# ([core] sensitive_var_conn_names adds to them), so an env named like a password is hidden wherever
# Airflow would hide a variable or connection extra of that name.
SENSITIVE_NAME_PARTS = (
    "access_token",
    "api_key",
    "apikey",
    "authorization",
    "passphrase",
    "passwd",
    "password",
    "private_key",
    "secret",
    "token",
    "keyfile_dict",
    "service_account",
)


# A git workdir's token for HTTPS URLs (SkyPilot's name). SkyPilot makes it a secret wherever it is given, so
# it is one here by name, whatever the name parts above say.
GIT_TOKEN = "GIT_TOKEN"
ALWAYS_SENSITIVE_NAMES = frozenset({GIT_TOKEN})


def is_sensitive_name(name: str) -> bool:
    lowered = name.lower()
    return name in ALWAYS_SENSITIVE_NAMES or any(part in lowered for part in SENSITIVE_NAME_PARTS)


def sensitive_values(task: EnvsAndSecrets) -> dict[str, str]:
    """What must never be shown of `task`: every secret, and every env whose name reads as a secret
    (GIT_TOKEN given in `envs` included)."""
    values = {k: v for k, v in task.envs.items() if v and is_sensitive_name(k)}
    values.update({k: v for k, v in task.secrets.items() if v})
    return values


def task_redactor(task: EnvsAndSecrets) -> Callable[[str], str]:
    """The one masker of a task's text outside Airflow's handlers (node logs, failure tails, CLI events)."""
    return redactor(sensitive_values(task).values())


def redactor(secrets: Iterable[str], mask: str = "***") -> Callable[[str], str]:
    """A function that replaces every secret value (and each line of a multi-line one) with `mask`.

    Airflow's masker covers Airflow's own handlers; node log lines are redacted here too, so neither the
    task log nor the CLI ever prints them, whatever logging setup runs the task.
    """
    needles: set[str] = set()
    for value in secrets:
        needles.add(value)
        needles.update(part for part in value.splitlines() if part.strip())
    ordered = sorted((n for n in needles if len(n) >= 3), key=len, reverse=True)  # longest first

    def redact(line: str) -> str:
        for needle in ordered:
            if needle in line:
                line = line.replace(needle, mask)
        return line

    return redact


def redact_json(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` (decoded JSON) with `redact` applied to every string in it, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_json(v, redact) for v in value]
    if isinstance(value, dict):
        return {redact(str(k)): redact_json(v, redact) for k, v in value.items()}
    return value
