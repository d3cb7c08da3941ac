"""Small JSON records with compare-and-swap, kept by the infra: where a cluster's job state lives.

The job state decides who leads a recovery, which generation runs and whether a job was cancelled, so it
must outlive the loss of any node (the head included) and must not live on an Airflow worker (with Celery
or Kubernetes executors, tasks of one job run on different machines). So each infra keeps it where it keeps
the truth about membership: the local state dir (local), an object store with conditional writes (clouds).

Every write is conditional on the version read: two writers that race never both win. Every record also
carries the time it was written *by the store's own clock* (a file's mtime, the state host's clock, the
bucket's `updated`, DynamoDB's response date): a lease read from it never compares two machines' clocks.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from typing import Any

from airflow_sky.errors import ClusterError

_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*$")


def validate_key(key: str) -> str:
    if not _KEY.match(key) or ".." in key or len(key) > 200:
        raise ValueError(
            f"invalid state key {key!r}: lowercase path segments of letters, digits, '.', '_', '-'"
        )
    return key


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A record and the version it was read at (the version a conditional write names)."""

    version: int
    data: dict[str, Any]
    # When the record was written, on the store's clock (StateStore.now() is on the same clock).
    written_at: float | None = dataclasses.field(default=None, compare=False)


class StateStore(abc.ABC):
    """One cluster's records. Thread- and process-safe; writes are atomic and conditional."""

    @abc.abstractmethod
    def get(self, key: str) -> Versioned | None:
        """The record at `key`, or None."""

    @abc.abstractmethod
    def put(self, key: str, data: dict[str, Any], expected_version: int | None) -> Versioned | None:
        """Write `data` if the record is still at `expected_version` (None: only if there is no record).

        Returns the record as written, or None when another writer got there first (read again, retry).
        """

    @abc.abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key directly under `prefix` (one level), sorted."""

    def now(self) -> float:
        """The store's own clock now (seconds since the epoch), the clock `written_at` is on.

        A scratch record is written and its stamp read back: one write, so callers ask rarely (a teardown
        deciding whether a job's lease expired), never in a loop's hot path.
        """
        for _ in range(50):
            current = self.get(_CLOCK_KEY)
            written = self.put(_CLOCK_KEY, {}, current.version if current else None)
            if written is not None and written.written_at is not None:
                return written.written_at
        raise ClusterError("the state store keeps no write time (or the clock record kept changing)")


_CLOCK_KEY = "clock"


def is_cluster_store(name: str) -> bool:
    """Whether a store of that name holds a cluster's records (not the fleet ledger's: a cluster's name
    never has a dot), for the infras that list their clusters from their stores."""
    return "." not in name
