"""User files read as text (task YAML, sidecars, dotenv files): bounded in size, UTF-8, one-line errors.

A task file is configuration a few kilobytes long. The bound keeps a hostile or mistaken file (a FIFO,
`/dev/zero`, a dataset saved as `.yaml`) from stalling `check` or a DAG processor reading a folder.
"""

from __future__ import annotations

import os
import stat

from airflow_sky.errors import SpecError

MAX_TEXT_BYTES = 256 * 1024  # 256 KiB; documented in docs/yaml-reference.md ("Limits")


def read_text_file(path: str | os.PathLike[str], label: str | None = None) -> str:
    """The file's text; a SpecError naming `label` (default: the path) when it is not a regular file, is
    larger than MAX_TEXT_BYTES or is not UTF-8."""
    label = label or os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SpecError(f"{label}: not a regular file; give a task file (YAML text)")
        with open(path, "rb") as stream:
            data = stream.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise SpecError(f"{label}: cannot read: {e.strerror or e}") from e
    if len(data) > MAX_TEXT_BYTES:
        raise SpecError(
            f"{label}: larger than {MAX_TEXT_BYTES // 1024} KiB; a task file holds configuration "
            "(put data in a file mount and scripts in the workdir)"
        )
    return decode_utf8(data, label)


def decode_utf8(data: bytes, label: str) -> str:
    """`data` as UTF-8 text, or a SpecError naming the line and column of the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        column = e.start - (before.rfind(b"\n") + 1) + 1
        raise SpecError(
            f"{label}: line {line}, column {column}: not UTF-8 text (byte 0x{data[e.start]:02x}); "
            "save the file as UTF-8"
        ) from None
