"""SkyFleetHook: every configured infra's clusters, jobs and costs (gang.fleet), for the Sky page and the CLI.

Each infra is asked in a thread of its own, all within one deadline: an infra that does not answer (a
pool's state host down, a cloud refusing the credentials) is one note, never a page that hangs. A cloud is
asked only when its Airflow connection exists (its SDK is not even imported otherwise).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseHook

from airflow_sky.errors import SpecError
from airflow_sky.gang import fleet
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.registry import configured_infras, default_conn_id, get_cloud

READ_TIMEOUT_S = 20.0


class InfraNotSetUp(Exception):
    """The infra is not configured here (no connection, its extra not installed): left out quietly."""


def _has_connection(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # Airflow raises its own not-found types, which differ between contexts
        return False
    return True


class SkyFleetHook(BaseHook):
    """The fleet on `infras` (default: every infra configured here)."""

    hook_name = "airflow-sky fleet"

    def __init__(self, infras: Sequence[str] | None = None, timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__()
        self.infras = list(infras) if infras is not None else None
        self.timeout_s = timeout_s

    def get_conn(self) -> list[str]:
        return self.infras if self.infras is not None else configured_infras()[0]

    def cluster(self, infra: str, name: str) -> Cluster:
        return Cluster(name, infra, self._cloud(infra))

    def _cloud(self, infra: str) -> Any:
        conn_id = default_conn_id(infra)
        if conn_id is not None and not _has_connection(conn_id):
            raise InfraNotSetUp(f"no Airflow connection {conn_id!r}")
        try:
            return get_cloud(infra)
        except SpecError as e:
            raise InfraNotSetUp(str(e)) from e

    def read(
        self, ended_since: float | None = None, with_progress: bool = True
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """(a view per cluster on every infra, [(infra, why it could not be read)])."""
        infras, problems = (self.infras, []) if self.infras is not None else configured_infras()
        # aws and aws/<region> share one ledger and one state table: each cloud is read once.
        unique = list(dict.fromkeys(infras))
        answers: dict[str, list[dict[str, Any]] | str] = {}
        lock = threading.Lock()
        now = time.time()

        def read_one(infra: str) -> None:
            try:
                answer: list[dict[str, Any]] | str = fleet.FleetReader(
                    self._cloud(infra), infra, with_progress
                ).read(ended_since, now)
            except InfraNotSetUp:
                answer = []
            except Exception as e:  # one infra that cannot answer is a note; the others are shown
                answer = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            with lock:
                answers[infra] = answer

        threads = [
            threading.Thread(target=read_one, args=(i,), daemon=True, name=f"fleet-{i}") for i in unique
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        rows: list[dict[str, Any]] = []
        notes = list(problems)
        with lock:
            for infra in unique:
                answer = answers.get(infra, f"no answer within {self.timeout_s:.0f}s")
                if isinstance(answer, str):
                    notes.append((infra, answer))
                else:
                    rows.extend(answer)
        return rows, notes

    # ---- actions ------------------------------------------------------------------------------------

    def down(self, infra: str, name: str, by: str, log: Callable[[str], None]) -> None:
        fleet.down_idle(self.cluster(infra, name), log, by)

    def stop(self, infra: str, name: str, by: str, log: Callable[[str], None]) -> bool:
        return fleet.stop(self.cluster(infra, name), log, by)

    def job_dag(self, infra: str, name: str, job_id: int) -> str | None:
        """The DAG whose run submitted job `job_id` (None: no such job, or one without a DAG)."""
        return fleet.job_dag(self.cluster(infra, name), job_id)

    def cancel_job(self, infra: str, name: str, job_id: int, by: str) -> bool:
        return fleet.cancel_job(self.cluster(infra, name), job_id, by)
