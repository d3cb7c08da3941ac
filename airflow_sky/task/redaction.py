"""Secret values out of text: what a task's secrets must never appear as in a log line or an error."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def redactor(secrets: Iterable[str]) -> Callable[[str], str]:
    """A function that replaces every secret value (and each line of a multi-line one) with `***`.

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
                line = line.replace(needle, "***")
        return line

    return redact
