"""Node log lines as SkyPilot prints them: `(head, rank=0, pid=17894) ...`, `(worker1, rank=1, pid=..., ip=...)`."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable


def node_prefix(rank: int, pid: int | None, ip: str | None = None, setup: bool = False) -> str:
    role = "head" if rank == 0 else f"worker{rank}"
    if setup:
        role = f"setup {role}"
    parts = [role, f"rank={rank}"] + ([f"pid={pid}"] if pid is not None else [])  # no pid known: none shown
    if rank != 0 and ip:
        parts.append(f"ip={ip}")
    return "(" + ", ".join(parts) + ")"


class LineSplitter:
    """Turns arbitrary byte chunks into whole decoded lines; keeps the last `keep` lines for error messages."""

    def __init__(self, emit: Callable[[str], None], keep: int = 20) -> None:
        self._emit = emit
        self._partial = b""
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self._emit_all(lines)

    @property
    def pending_bytes(self) -> int:
        """Bytes fed but not emitted yet (an unfinished last line)."""
        return len(self._partial)

    def flush(self) -> None:
        if self._partial:
            self._emit_all([self._partial])
            self._partial = b""

    def _emit_all(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            self.tail.append(line)
            self._emit(line)
