"""How spec problems are reported: one-line SpecErrors naming source and field; one SpecWarning per task."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_sky.errors import SkyError, SpecError

PYTHON_SOURCE = "<python>"
STRING_SOURCE = "<string>"

PathPart = str | int


class SpecWarning(UserWarning):
    """A task uses fields that airflow-sky parses and keeps but does not act on yet."""


def format_path(path: Sequence[PathPart]) -> str:
    """Dotted field path: ('resources', 'any_of', 0, 'cpus') -> 'resources.any_of.0.cpus'."""
    return ".".join(str(part) for part in path) or "<root>"


def show(value: Any) -> str:
    """A short, one-line rendering of a user value for error messages."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text.replace("\n", "\\n")


def one_line(text: str) -> str:
    """Collapse whitespace and newlines so a message stays on one line."""
    return " ".join(text.split())


def known_fields(
    value: Any, allowed: Sequence[str], where: str, shape: str, error: type[SkyError] = SpecError
) -> dict[str, Any]:
    """`value` as a mapping whose fields are all `allowed`; else `error` naming `where` and, for a value
    that is no mapping, what it must be (`shape`). For settings and confs read from outside (YAML, JSON)."""
    if not isinstance(value, Mapping):
        raise error(f"{where}: must be {shape}")
    unknown = sorted(str(key) for key in set(value) - set(allowed))
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    return dict(value)


def unknown_field_message(key: Any, allowed: Iterable[str]) -> str:
    """'unknown field; did you mean ...? (allowed: ...)', the did-you-mean found with difflib."""
    names = sorted(allowed)
    return f"unknown field{did_you_mean(str(key), names)} (allowed: {', '.join(names)})"


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """ "; did you mean 'x'?" naming the known word closest to `word` (difflib), or "" when none is close."""
    close = difflib.get_close_matches(word, sorted(set(known) - {word}), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclasses.dataclass
class SpecContext:
    """Where a spec comes from, and the parsed-but-inert fields found while building it."""

    source: str = PYTHON_SOURCE
    inert: list[str] = dataclasses.field(default_factory=list)

    def error(self, path: Sequence[PathPart], message: str) -> SpecError:
        """`<source>: <field.path>: <message>`, always one line."""
        return SpecError(one_line(f"{self.source}: {format_path(path)}: {message}"))

    def note_inert(self, path: Sequence[PathPart]) -> None:
        self.inert.append(format_path(path))

    def warn_inert(self, stacklevel: int = 3) -> None:
        """One SpecWarning listing every parsed-but-not-acted-on field (nothing is dropped silently)."""
        if self.inert:
            fields = ", ".join(self.inert)
            warnings.warn(
                f"{self.source}: parsed but not acted on yet (kept as written): {fields}",
                SpecWarning,
                stacklevel=stacklevel,
            )
