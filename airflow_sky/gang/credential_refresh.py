"""Keeping a running job's bucket credentials fresh on its nodes: the watch holder's chore.

A node's mounts fetch their credential (an STS session, a downscoped token) from the node's credential
server (node.credential_server). Whoever holds the watch lease of the job's running phase (the one
process that already probes every rank: a follow task, its trigger, the detached driver) mints a fresh
credential from the job's bucket record and writes it to every node of the phase at half the current
credential's life: one mint and one SSH exec per node per refresh, whatever the number of followers.

When the job state has no record of the credential on the nodes yet (the first hold after the sync),
the holder replaces it at once, which records when the next refresh is due. A failed refresh is logged
(never the credential) and tried again after RETRY_S; a job whose mounts need no served credential
(instance profile, service account, COPY only) is recorded as such and never minted for.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_sky.gang import state as js
from airflow_sky.gang.phases import BUCKETS_INFO_KEY
from airflow_sky.node.client import NodeClient
from airflow_sky.task.storage import COPY, BucketMount

INFO_KEY = "node_credentials"  # in the job state's info: {"issued": iso, "expires": iso or None}
LEAD_S = 10 * 60  # a fresh credential is on the nodes this long before the old one expires, at the latest
# (rclone's s3 fetches it again 5 minutes before the Expiration it has; a gcs mount every 5 minutes)
RETRY_S = 60.0  # after a failed refresh


def refresh_time(issued: datetime.datetime, expires: datetime.datetime | None) -> datetime.datetime | None:
    """When a credential issued at `issued` and expiring at `expires` is replaced on the nodes: at half its
    life, and LEAD_S before it expires at the latest; one that lives less than LEAD_S at half its life
    (None: it never expires)."""
    if expires is None:
        return None
    half = issued + (expires - issued) / 2
    ahead = min(half, expires - datetime.timedelta(seconds=LEAD_S))
    return ahead if ahead > issued else half


def refresh_due(record: Mapping[str, Any] | None, now: datetime.datetime) -> bool:
    """Whether the credential the job state's `record` (INFO_KEY) describes must be replaced at `now`;
    no record: the nodes hold the attach's credential, of unknown age, so yes."""
    if not record:
        return True
    expires = record.get("expires")
    if not expires:
        return False
    at = refresh_time(
        datetime.datetime.fromisoformat(record["issued"]), datetime.datetime.fromisoformat(expires)
    )
    return at is not None and now >= at


def served_mounts(bucket_record: Mapping[str, Any] | None) -> list[BucketMount]:
    """The mounts of a job's bucket record whose credential a node may need replaced while the job runs:
    MOUNT and MOUNT_CACHED of stores the nodes reach with no identity of their own."""
    if not bucket_record or not bucket_record.get("mounts"):
        return []
    identity = set(bucket_record.get("node_identity") or ())
    mounts = [BucketMount.from_dict(m) for m in bucket_record["mounts"]]
    return [m for m in mounts if m.mode != COPY and m.store not in identity]


class CredentialRefresh:
    """The watch holder's refresher for job `job_id` on the nodes `clients` gives (rank -> client)."""

    def __init__(
        self,
        states: js.JobStates,
        job_id: int,
        clients: Callable[[], Mapping[int, NodeClient]],
        log: Callable[[str], None],
        fan_out: Callable[[list[Callable[[], object]]], None],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.states = states
        self.job_id = job_id
        self._clients = clients
        self._log = log
        self._fan_out = fan_out
        self._clock = clock
        self._retry_at = 0.0

    def round(self, state: js.JobState) -> js.JobState:
        """Refresh when due (pure check first: a round that is not due costs nothing); never raises."""
        if state.status.is_terminal or time.monotonic() < self._retry_at:
            return state
        if not served_mounts(state.info.get(BUCKETS_INFO_KEY)):
            return state
        if not refresh_due(state.info.get(INFO_KEY), self._clock()):
            return state
        try:
            return self.refresh(state)
        except Exception as error:  # the mounts keep their credential until it expires; try again soon
            self._retry_at = time.monotonic() + RETRY_S
            self._log(
                f"job {self.job_id}: refreshing the nodes' bucket credentials failed "
                f"({type(error).__name__}: {str(error)[:300]}); trying again in {RETRY_S:.0f}s"
            )
            return state

    def refresh(self, state: js.JobState) -> js.JobState:
        """Mint a fresh credential from the job's bucket record and write it to every node; record it."""
        # Lazily: node.buckets loads Airflow's object storage, which the CLI's read-only commands (queue,
        # status: they import the gang core) must not pay for.
        from airflow_sky.node import buckets

        issued = self._clock()
        record = state.info.get(BUCKETS_INFO_KEY) or {}
        plan = buckets.plan_from_record({**record, "mounts": [m.to_dict() for m in served_mounts(record)]})
        expires = plan.expires if plan is not None else None
        if plan is not None and plan.served:
            failures: list[str] = []

            def write(rank: int, client: NodeClient) -> None:
                try:
                    buckets.refresh_credentials(client, plan)
                except Exception as error:
                    failures.append(f"rank {rank}: {error}")

            self._fan_out([lambda r=r, c=c: write(r, c) for r, c in sorted(self._clients().items())])  # type: ignore[misc]
            if failures:
                raise RuntimeError("; ".join(sorted(failures))[:600])
            self._log(
                f"job {self.job_id}: replaced the nodes' bucket credentials (valid until "
                f"{expires:%Y-%m-%d %H:%M} UTC)"
                if expires
                else f"job {self.job_id}: replaced the nodes' bucket credentials"
            )
        entry = {"issued": issued.isoformat(), "expires": expires.isoformat() if expires else None}
        state, _ = self.states.update(
            self.job_id, lambda s: dataclasses.replace(s, info={**s.info, INFO_KEY: entry})
        )
        return state
