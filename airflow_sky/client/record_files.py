"""Local records that several airflow-sky processes write (the cluster index, the user's ssh config).

Every write holds an exclusive flock on a sibling lock file, reads the current content inside it, and
replaces the file with a complete new one (a temp file in the same directory, fsynced, then os.replace):
two launches at once lose no entry, and a process killed mid-write leaves the old file intact.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

_TEMP_INFIX = ".airflow-sky-"  # temp files are `.<name>.airflow-sky-<random>.tmp`: never a user's own name
_TEMP_SUFFIX = ".tmp"


def lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path: Path, guards: Sequence[Path] = ()) -> Iterator[None]:
    """Hold the exclusive lock of `path` (and of the files it `guards`); flock: the kernel releases it
    when a holder dies.

    A temp file of these found once the lock is held was left by a writer that died before its replace
    (writers only make one while holding the lock): it is removed.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_file(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for guarded in (path, *guards):
            for leftover in guarded.parent.glob(f".{guarded.name}{_TEMP_INFIX}*{_TEMP_SUFFIX}"):
                leftover.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def replace_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Make `path` hold `text`, with permissions `mode`: readers see the old file or the new, never a part.

    Call with `locked(path)` held. Both the file and the directory entry are fsynced, so a power cut
    leaves one of the two versions as well.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{_TEMP_INFIX}", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def remove(path: Path) -> None:
    """Remove `path` (if there), durably. Call with `locked(path)` held."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
