"""SkyPoolHook: a job's door to a pool of warm workers (gang.pool): wait for a free worker, hand it over."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from airflow.sdk import BaseHook

from airflow_sky.gang.pool import PoolQueue, PoolRecord, open_pool


class SkyPoolHook(BaseHook):
    """One pool on one infra; reads its record once per hook."""

    def __init__(self, pool: str, infra: str = "local", conn_id: str | None = None) -> None:
        super().__init__()
        self.pool = pool
        self.infra = infra or "local"
        self.conn_id = conn_id

    @functools.cached_property
    def _opened(self) -> tuple[PoolRecord, PoolQueue]:
        return open_pool(self.pool, self.infra, self.conn_id)

    @property
    def record(self) -> PoolRecord:
        return self._opened[0]

    def get_conn(self) -> PoolQueue:
        return self._opened[1]

    def wait_for_worker(
        self, key: str, label: str, say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep
    ) -> tuple[str, int]:
        """Wait (PENDING) for a free worker of the pool; returns (its cluster name, the job's ticket).
        `sleep` waits between looks (and may raise to stop waiting: a cancelled sweep)."""
        return self.get_conn().wait_for_worker(key, label, self.record.workers, say, sleep=sleep)

    def hand_over(self, worker: str, ticket: int) -> None:
        self.get_conn().hand_over(worker, ticket)

    def give_up(self, ticket: int, worker: str | None) -> None:
        self.get_conn().give_up(ticket, worker)
