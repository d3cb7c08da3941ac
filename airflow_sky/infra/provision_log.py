"""A cluster's provision log, as `sky logs --provision` shows SkyPilot's provision.log.

What the latest provisioning of the cluster did: the infra driver's own lines (launching, failover, placement
groups, opened ports) and, once it is up, one line per node. It is kept next to the job state, in the
infra's state store, so a scheduler's worker, the CLI and any later `logs --provision` read the same record
wherever provisioning ran; it goes away with the cluster. Bounded (MAX_BYTES, the oldest lines dropped
first): the record stays far below the smallest store's item limit (DynamoDB's 400 KB).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.state_store import StateStore

KEY = "provision-log"
MAX_BYTES = 64 * 1024
MAX_LINE_CHARS = 2000
FLUSH_EVERY_S = 2.0  # a followed provision shows its lines this late at most
STALE_S = 900.0  # a followed log not written for this long has no provisioning behind it any more
INFRA_LOGGER = "airflow_sky.infra"  # every driver logs under it

log = logging.getLogger(__name__)

# (its number in the whole log, from 0; the node's rank, or None for the whole cluster; the text)
Line = tuple[int, int | None, str]


def bounded(lines: list[Line], max_bytes: int = MAX_BYTES) -> list[Line]:
    """The newest lines that fit in `max_bytes` (each line's UTF-8 text, plus a little for its numbers)."""
    total, keep = 0, 0
    for _, _, text in reversed(lines):
        total += len(text.encode()) + 16
        if total > max_bytes:
            break
        keep += 1
    return lines[len(lines) - keep :]


def clip(text: str) -> str:
    """One stored line: a long one cut (a driver may log a whole API answer), named as cut."""
    text = text.rstrip("\n")
    return text if len(text) <= MAX_LINE_CHARS else f"{text[:MAX_LINE_CHARS]} [... {len(text)} chars]"


def stamp(text: str, when: float | None = None) -> str:
    return f"{datetime.fromtimestamp(time.time() if when is None else when, UTC):%Y-%m-%d %H:%M:%S} {text}"


def node_text(node: Node) -> str:
    """A node's line once the cluster is up: what `logs --provision --worker N` shows of it."""
    role = "head" if node.rank == 0 else f"worker{node.rank}"
    return stamp(
        f"rank {node.rank} ({role}): {node.internal_ip}, instance {node.instance_id}, {node.status.value}"
    )


class ProvisionLog:
    """The record one provisioning writes. A newer provisioning of the cluster replaces it: this writer
    then stops writing (its lines are no longer the latest)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.launch = uuid.uuid4().hex
        self.lines: list[Line] = []
        self.count = 0  # lines ever added (the kept ones are the last of them)
        self.ended = False
        self.ok: bool | None = None
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._last_flush = 0.0
        self._written = False  # the first write replaces the previous provisioning's record
        self._replaced = False
        self._pending: threading.Timer | None = None  # a throttled line's write, due FLUSH_EVERY_S later

    def add(self, text: str, rank: int | None = None) -> None:
        with self._lock:
            self.lines = bounded([*self.lines, (self.count, rank, clip(text))])
            self.count += 1

    def end(self, ok: bool, text: str) -> None:
        self.add(stamp(text))
        self.ended, self.ok = True, ok
        if self._pending is not None:
            self._pending.cancel()
        self.flush(force=True, wait=True)

    def flush(self, force: bool = False, wait: bool = False) -> None:
        """Write the record now (or, unless `force`, when FLUSH_EVERY_S passed since the last write).

        Never raises: provisioning goes on without its log when the store does not answer (said once).
        A write from inside a write (a store that logs under the infra's logger) is skipped. `wait` (the
        end's write): after a write in progress on another thread (a throttled line's timer), never
        instead of it: that write may hold the record as it was before the end.
        """
        if self._replaced or not self._flushing.acquire(blocking=wait):
            return
        try:
            due_in = self._last_flush + FLUSH_EVERY_S - time.monotonic()
            if not force and due_in > 0:
                if self._pending is None:  # the line is written then, even if no other line follows
                    self._pending = threading.Timer(due_in, self._deferred)
                    self._pending.daemon = True
                    self._pending.start()
                return
            self._last_flush = time.monotonic()
            self._write()
        except Exception as e:  # the log is an aid: it never fails the provisioning
            self._replaced = True
            log.warning("the provision log is not kept (its store failed: %s)", e)
        finally:
            self._flushing.release()

    def _deferred(self) -> None:
        self._pending = None
        if not self.ended:
            self.flush(force=True)

    def _write(self) -> None:
        with self._lock:
            data: dict[str, Any] = {
                "launch": self.launch,
                "ended": self.ended,
                "ok": self.ok,
                "lines": [list(line) for line in self.lines],
            }
        for _ in range(20):
            current = self.store.get(KEY)
            if self._written and (current is None or current.data.get("launch") != self.launch):
                self._replaced = True  # a newer provisioning's log (or the cluster went down)
                return
            if self.store.put(KEY, data, current.version if current else None) is not None:
                self._written = True
                return
        raise ClusterError("the provision log record kept changing under this writer")


class _Capture(logging.Handler):
    """The infra's log lines of the provisioning thread only: another cluster provisioning in the same
    process at the same time (a worker running two tasks) logs under the same logger."""

    def __init__(self, target: ProvisionLog) -> None:
        super().__init__(logging.INFO)
        self.target = target
        self.thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        self.target.add(stamp(f"{level}{record.getMessage()}", record.created))
        self.target.flush()


@contextlib.contextmanager
def recording(store: StateStore, title: str) -> Iterator[ProvisionLog]:
    """Record a provisioning: `title` first, the infra's log lines while it runs, then its end (the
    caller adds the nodes' lines with `node_line`). A failure ends the log with its error and goes on."""
    target = ProvisionLog(store)
    target.add(stamp(title))
    target.flush(force=True)
    handler = _Capture(target)
    infra = logging.getLogger(INFRA_LOGGER)
    infra.addHandler(handler)
    started = time.monotonic()
    try:
        yield target
    except BaseException as e:
        infra.removeHandler(handler)
        target.end(False, f"provisioning failed after {time.monotonic() - started:.0f}s: {e}")
        raise
    infra.removeHandler(handler)
    target.end(True, f"provisioned in {time.monotonic() - started:.0f}s")


def provisioned(
    store: StateStore,
    request: ProvisionRequest,
    existing: list[Node],
    provision: Callable[[ProvisionRequest], list[Node]],
) -> list[Node]:
    """`provision(request)`, recorded as the cluster's provision log (a reuse, which provisions nothing,
    keeps the log of the provisioning that made the nodes)."""
    running = sum(n.status is NodeStatus.RUNNING for n in existing)
    title = (
        f"Provisioning cluster {request.cluster_name}: {request.num_nodes} node(s)"
        f" ({len(existing)} existing, {running} of them running)"
    )
    with recording(store, title) as record:
        nodes = provision(request)
        for node in nodes:
            record.add(node_text(node), node.rank)
    return nodes


def read(store: StateStore) -> dict[str, Any] | None:
    current = store.get(KEY)
    return current.data if current else None


def selected(record: dict[str, Any], worker: int | None, after: int = -1) -> list[tuple[int, str]]:
    """The record's lines numbered after `after`: all of them, or only node `worker`'s (SkyPilot's
    per-worker provision log). A gap before the first kept line is said."""
    lines = [(int(seq), rank, str(text)) for seq, rank, text in record.get("lines", [])]
    picked = [(seq, text) for seq, rank, text in lines if seq > after and (worker is None or rank == worker)]
    if worker is None and lines and lines[0][0] > after + 1:
        gap = f"[... {lines[0][0] - after - 1} earlier lines dropped: the log keeps its last {MAX_BYTES // 1024} KiB]"
        picked.insert(0, (after, gap))
    return picked


def show(
    store: StateStore,
    emit: Callable[[str], None],
    *,
    worker: int | None = None,
    follow: bool = True,
    tail: int = 0,
    poll_s: float = 1.0,
) -> dict[str, Any] | None:
    """Print the provision log (its last `tail` lines when > 0); with `follow`, until that provisioning
    ends (or its record went unwritten for STALE_S). Returns the record as last read, None if none."""
    record = read(store)
    if record is None:
        return None
    lines = selected(record, worker)
    for _, text in lines[-tail:] if tail > 0 else lines:
        emit(text)
    seen = max((seq for seq, _, _ in record.get("lines", [])), default=-1)
    launch, changed = record.get("launch"), time.monotonic()
    while follow and not record.get("ended"):
        time.sleep(poll_s)
        current = read(store)
        if current is None or current.get("launch") != launch:
            emit("[the provision log was replaced: the cluster went down, or another provisioning began]")
            return current
        if current == record:
            if time.monotonic() - changed > STALE_S:
                emit(f"[the provision log has not changed for {STALE_S:.0f}s: its provisioning is gone?]")
                return record
            continue
        record, changed = current, time.monotonic()
        for _, text in selected(record, worker, after=seen):
            emit(text)
        seen = max((seq for seq, _, _ in record.get("lines", [])), default=seen)
    return record
