"""Node log lines as SkyPilot prints them: `(head, rank=0, pid=17894) ...`, `(worker1, rank=1, pid=..., ip=...)`."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from airflow_sky.progress import MARKER


def node_prefix(rank: int, pid: int | None, ip: str | None = None, setup: bool = False) -> str:
    role = "head" if rank == 0 else f"worker{rank}"
    if setup:
        role = f"setup {role}"
    parts = [role, f"rank={rank}"] + ([f"pid={pid}"] if pid is not None else [])  # no pid known: none shown
    if rank != 0 and ip:
        parts.append(f"ip={ip}")
    return "(" + ", ".join(parts) + ")"


# A line longer than this is not held whole: a progress bar that redraws its line with `\r` for hours (tqdm)
# never ends it, and the reader (a follow task, the triggerer) must not grow with it.
MAX_LINE_BYTES = 64 * 1024
_REPORT = MARKER.encode()


def drop_redraws(raw: bytes) -> tuple[bytes, bytes | None]:
    """A long line that `\r` rewrote, as a terminal shows it: its latest redraw (a trailing `\r` kept), and the
    newest progress report among the redraws it overwrote (the report's own `\r` fragment), if any."""
    cut = raw.rstrip(b"\r").rfind(b"\r")
    if cut < 0:
        return raw, None
    overwritten = raw[:cut]
    marked = overwritten.rfind(_REPORT)
    report = None
    if marked >= 0:
        end = overwritten.find(b"\r", marked)
        report = overwritten[marked : end if end >= 0 else None]
    return raw[cut + 1 :], report


class LineSplitter:
    """Turns arbitrary byte chunks into whole decoded lines; keeps the last `keep` lines for error messages
    (progress report lines left out).

    Memory stays bounded whatever the log holds: a line over MAX_LINE_BYTES keeps only its latest `\r`
    redraw (and, as a line of its own, the newest progress report the dropped redraws held), and a line
    still longer is emitted in MAX_LINE_BYTES pieces.
    """

    def __init__(self, emit: Callable[[str], None], keep: int = 20) -> None:
        self._emit = emit
        self._partial = b""
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        lines = (self._partial + data).split(b"\n")
        partial = lines.pop()
        self._emit_all(lines)
        if len(partial) > MAX_LINE_BYTES:
            # Unfinished and long: the bytes a redraw overwrote are dropped, and whole pieces go out now.
            partial = self._latest_redraw(partial)
            while len(partial) > MAX_LINE_BYTES:
                self._emit_all([partial[:MAX_LINE_BYTES]])
                partial = partial[MAX_LINE_BYTES:]
        self._partial = partial

    @property
    def pending_bytes(self) -> int:
        """Bytes fed but not emitted yet (an unfinished last line)."""
        return len(self._partial)

    def flush(self) -> None:
        if self._partial:
            self._emit_all([self._partial])
            self._partial = b""

    def _emit_all(self, lines: Iterable[bytes]) -> None:
        for whole in lines:
            raw = self._latest_redraw(whole) if len(whole) > MAX_LINE_BYTES else whole
            for start in range(0, max(len(raw), 1), MAX_LINE_BYTES):
                line = raw[start : start + MAX_LINE_BYTES].decode("utf-8", errors="replace").rstrip("\r")
                if _REPORT not in raw:  # an error message quotes the job's output, not its progress reports
                    self.tail.append(line)
                self._emit(line)

    def _latest_redraw(self, raw: bytes) -> bytes:
        """A line over the limit as a terminal shows it (drop_redraws); the newest progress report the dropped
        redraws held goes out first, as a line of its own."""
        latest, report = drop_redraws(raw)
        if report is not None:
            self._emit_all([report])
        return latest
