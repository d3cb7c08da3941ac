"""The fleet ledger: one record per cluster, kept by the infra, that outlives the cluster.

What the fleet page, `cost-report`, `status` and a run's `cost` XCom read: who owns the cluster (the DAG
run, the user), what its nodes are and cost (the packaged catalog's price of its instance type, spot or
on demand), when each node ran (spans: a node-hour is billed from the provision that brought the node up to
the teardown, stop or loss that ended it) and what happened to it (events: provisioned, preempted, replaced,
setup failed, stopped, autostopped, torn down).

It lives in the infra's state store, under a store of its own (STORE: a dot is never in a cluster's name),
so any Airflow worker, the API server and the CLI read the same record; a node never reaches it. Each
cluster's record is written only by the code that changes the cluster (infra/cluster.py) and by a reader
that finds the infra disagreeing with it (a node that stopped itself), always with a conditional write.
Bounded: MAX_EVENTS newest events and MAX_SPANS newest spans (older spans are folded into a sum), so a
long-lived pool worker's record stays small. A torn-down cluster's record is kept (`ended/`) for
RETAIN_S, as `sky cost-report` shows recently terminated clusters.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from airflow_sky.infra.state_store import StateStore

STORE = "sky.ledger"  # the store's name beside the clusters' own (no cluster is ever called this)
LIVE_PREFIX = "clusters"
ENDED_PREFIX = "ended"
MAX_EVENTS = 64
MAX_SPANS = 256
RETAIN_S = 30 * 24 * 3600.0  # a torn-down cluster's record is kept this long
_WRITE_ATTEMPTS = 30
# Set by the CLI's launch engine (its runs live in a private Airflow): the user who launched, for the owner.
LAUNCHED_BY_ENV = "AIRFLOW_SKY_LAUNCHED_BY"
COST_XCOM_KEY = "cost"  # a run's cost, pushed by teardown (summary())

log = logging.getLogger(__name__)

# A node's time on the bill: [rank, instance id, start, end or None while it runs] (seconds since the epoch).
Span = list[Any]
# [when, kind, rank or None, text]
Event = list[Any]


@dataclasses.dataclass(frozen=True)
class Billing:
    """What one node of the cluster costs: its instance type, spot or not, and the catalog's hourly price."""

    instance_type: str
    use_spot: bool
    hourly: float | None  # None: the catalog has no price for it here
    region: str | None = None
    zone: str | None = None
    catalog_as_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def catalog_billing(
    cloud: str,
    instance_type: str,
    use_spot: bool,
    region: str | None,
    zone: str | None,
    accelerator: str | None = None,
) -> Billing:
    """A node's billing from the packaged catalog: the offering of that type in that zone (else region)."""
    from airflow_sky.infra import catalog

    same_type = [o for o in catalog.offerings(cloud) if o.instance_type == instance_type]
    # An n1 host's rows differ by the GPU attached: the cluster's, when it names one.
    same_type = [o for o in same_type if o.accelerator == accelerator] or same_type
    found = next((o for o in same_type if zone and o.zone == zone), None) or next(
        (o for o in same_type if region and o.region == region), None
    )
    return Billing(
        instance_type=instance_type,
        use_spot=use_spot,
        hourly=found.hourly(use_spot) if found is not None else None,
        region=region,
        zone=zone,
        catalog_as_of=str(catalog.meta().get("as_of")) if catalog.meta().get("as_of") else None,
    )


def owner_of(dag_id: str, run_id: str, triggering_user: str | None) -> dict[str, str | None]:
    """Who owns a cluster a DAG run brings up: the run, and the user who triggered it (the CLI's user for
    a launch from the CLI, whose DAG runs in its own private Airflow: `via` says which)."""
    cli_user = os.environ.get(LAUNCHED_BY_ENV)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        # A CLI launch's DAG runs under `dags test` in a private Airflow: its "triggering user" is no one's.
        "user": cli_user or triggering_user,
        "via": "cli" if cli_user else "airflow",
    }


# ---- pure rules ---------------------------------------------------------------------------------------


def new_record(
    cluster: str, infra: str, owner: Mapping[str, Any] | None, billing: Billing | None, now: float
) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "infra": infra,
        "owner": dict(owner) if owner else None,
        "billing": billing.to_dict() if billing else None,
        "launched_at": now,
        "ended_at": None,
        "spans": [],
        "folded_s": 0.0,  # node-seconds of spans dropped from `spans` (the oldest closed ones)
        "folded_until": None,  # the latest end among them
        "events": [],
        "events_dropped": 0,
    }


def with_event(
    record: dict[str, Any], when: float, kind: str, text: str, rank: int | None = None
) -> dict[str, Any]:
    events = [*record.get("events", []), [when, kind, rank, text]]
    dropped = max(0, len(events) - MAX_EVENTS)
    return record | {
        "events": events[dropped:],
        "events_dropped": int(record.get("events_dropped", 0)) + dropped,
    }


def open_ranks(record: Mapping[str, Any]) -> dict[int, Span]:
    """The spans of nodes still on the bill, by rank."""
    return {int(s[0]): s for s in record.get("spans", []) if s[3] is None}


def _folded(record: dict[str, Any]) -> dict[str, Any]:
    """Fold the oldest closed spans into `folded_s` until at most MAX_SPANS remain."""
    spans = list(record["spans"])
    folded_s = float(record.get("folded_s", 0.0))
    folded_until = record.get("folded_until")
    while len(spans) > MAX_SPANS:
        oldest = next((i for i, s in enumerate(spans) if s[3] is not None), None)
        if oldest is None:
            break
        _, _, start, end = spans.pop(oldest)
        folded_s += max(0.0, end - start)
        folded_until = max(end, folded_until or end)
    return record | {"spans": spans, "folded_s": folded_s, "folded_until": folded_until}


def with_nodes(
    record: dict[str, Any], running: Mapping[int, str], now: float
) -> tuple[dict[str, Any], list[str]]:
    """The record with its open spans matching the nodes that run now (rank -> instance id): a rank whose
    instance changed or that no longer runs closes its span; a new one opens. Returns what changed."""
    spans = [list(s) for s in record.get("spans", [])]
    changes: list[str] = []
    for span in spans:
        rank, instance = int(span[0]), span[1]
        if span[3] is None and running.get(rank) != instance:
            span[3] = now
            changes.append(f"rank {rank} ({instance}) off the bill")
    still_open = {int(s[0]) for s in spans if s[3] is None}
    for rank, instance in sorted(running.items()):
        if rank not in still_open:
            spans.append([rank, instance, now, None])
            changes.append(f"rank {rank} ({instance}) on the bill")
    return _folded(record | {"spans": spans}), changes


def closed(record: dict[str, Any], now: float) -> dict[str, Any]:
    """The record with every node off the bill (a stop, a teardown, a loss of every node)."""
    updated, _ = with_nodes(record, {}, now)
    return updated


def node_seconds(
    record: Mapping[str, Any], now: float, since: float | None = None, until: float | None = None
) -> float:
    """Node-seconds billed, all of the record's or only those between `since` and `until` (a run's share).
    Folded spans count in full when they may overlap the window (their times are gone)."""
    total = 0.0
    lo = since if since is not None else float("-inf")
    hi = until if until is not None else now
    for _, _, start, end in record.get("spans", []):
        a, b = max(start, lo), min(end if end is not None else now, hi)
        total += max(0.0, b - a)
    folded_until = record.get("folded_until")
    if folded_until is not None and folded_until > lo:
        total += float(record.get("folded_s", 0.0))
    return total


def hourly_per_node(record: Mapping[str, Any]) -> float | None:
    billing = record.get("billing")
    if not billing:
        return 0.0  # local nodes and ssh pool hosts: nothing is billed by the hour here
    price = billing.get("hourly")
    return float(price) if price is not None else None


def cost(
    record: Mapping[str, Any], now: float, since: float | None = None, until: float | None = None
) -> float | None:
    """price per node-hour times node-hours (None where the catalog has no price)."""
    price = hourly_per_node(record)
    if price is None:
        return None
    return price * node_seconds(record, now, since, until) / 3600.0


def cost_per_hour(record: Mapping[str, Any]) -> float | None:
    """What the cluster costs per hour now: the price of each node on the bill."""
    price = hourly_per_node(record)
    return None if price is None else price * len(open_ranks(record))


def summary(record: Mapping[str, Any], now: float, since: float | None = None) -> dict[str, Any]:
    """The `cost` XCom and `cost-report`'s row: what was billed and how it was reckoned."""
    billing = record.get("billing") or {}
    seconds = node_seconds(record, now, since)
    price = hourly_per_node(record)
    return {
        "cluster": record.get("cluster"),
        "infra": record.get("infra"),
        "instance_type": billing.get("instance_type"),
        "use_spot": bool(billing.get("use_spot")),
        "hourly_per_node": price,
        "node_hours": round(seconds / 3600.0, 6),
        "cost": None if price is None else round(price * seconds / 3600.0, 6),
        "cost_per_hour": cost_per_hour(record),
        "catalog_as_of": billing.get("catalog_as_of"),
        "since": since,
    }


def money(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def cost_line(cost: Mapping[str, Any]) -> str:
    """The job's summary line of its cost: `Cost: $0.42 (3 node-hours of m6i.large on demand at $0.096/h,
    catalog of 2026-11-01)`; a cluster nothing bills by the hour says so."""
    if not cost.get("instance_type"):
        return f"Cost: $0.00 ({cost.get('node_hours', 0):.3f} node-hours on {cost.get('infra')}: not billed by the hour)"
    kind = "spot" if cost.get("use_spot") else "on demand"
    rate = money(cost.get("hourly_per_node"))
    return (
        f"Cost: {money(cost.get('cost'))} ({cost.get('node_hours', 0):.3f} node-hours of "
        f"{cost['instance_type']} {kind} at {rate}/h per node, catalog of {cost.get('catalog_as_of') or '?'})"
    )


# ---- the store ----------------------------------------------------------------------------------------


def live_key(cluster: str) -> str:
    return f"{LIVE_PREFIX}/{cluster}"


class Ledger:
    """The ledger records of one infra (one state store). Writers never fail their caller's operation:
    a ledger that cannot be written is said in the log (the cluster's work matters more than its bill)."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def get(self, cluster: str) -> dict[str, Any] | None:
        found = self.store.get(live_key(cluster))
        return found.data if found else None

    def live(self) -> list[dict[str, Any]]:
        """The records of clusters not torn down (up, stopped, or lost without a teardown)."""
        found = (self.store.get(key) for key in self.store.keys(LIVE_PREFIX))
        return current_records([f.data for f in found if f is not None])

    def ended(self, since: float | None = None) -> list[dict[str, Any]]:
        """Torn-down clusters' records (those ended after `since`, when given), oldest first. The key holds
        the end time: only the records asked for are read."""
        records = []
        for key in self.store.keys(ENDED_PREFIX):
            ended_at = _ended_at(key)
            if ended_at is None or (since is not None and ended_at < since):
                continue
            found = self.store.get(key)
            if found is not None and found.data.get("ended_at") is not None:
                records.append(found.data)
        return sorted(records, key=lambda r: r.get("ended_at") or 0)

    def update(
        self, cluster: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply `change` to the cluster's record with a conditional write (None from it: no write)."""
        key = live_key(cluster)
        for _ in range(_WRITE_ATTEMPTS):
            current = self.store.get(key)
            updated = change(current.data if current else None)
            if updated is None or (current is not None and updated == current.data):
                return current.data if current else None
            if self.store.put(key, updated, current.version if current else None) is not None:
                return updated
        raise RuntimeError(f"the ledger record of cluster {cluster!r} kept changing under this writer")

    def safely(self, what: str, write: Callable[[], object]) -> None:
        try:
            write()
        except Exception as e:  # the bill is an aid: it never fails provisioning or a teardown
            log.warning("the fleet ledger was not updated (%s): %s", what, e)

    # ---- what the cluster's code records ----------------------------------------------------------------

    def provisioned(
        self,
        cluster: str,
        infra: str,
        running: Mapping[int, str],
        owner: Mapping[str, Any] | None,
        billing: Billing | None,
        what: str,
        kind: str = "provisioned",
    ) -> None:
        """The cluster's nodes after a provisioning (rank -> instance id of each running node); `kind`
        names the event (`started` for a stopped cluster started again)."""
        now = self.clock()

        def change(record: dict[str, Any] | None) -> dict[str, Any]:
            fresh = record is None or record.get("ended_at") is not None
            base = new_record(cluster, infra, owner, billing, now) if fresh else dict(record or {})
            if not fresh and billing is not None:
                base["billing"] = billing.to_dict()
            if owner and not base.get("owner"):
                base["owner"] = dict(owner)
            updated, changes = with_nodes(base, running, now)
            if fresh:
                return with_event(updated, now, "provisioned", what)
            return with_event(updated, now, kind, what) if changes else updated

        self.update(cluster, change)

    def node_replaced(self, cluster: str, rank: int, old: str, new: str) -> None:
        now = self.clock()

        def change(record: dict[str, Any] | None) -> dict[str, Any] | None:
            if record is None:
                return None
            current = {r: s[1] for r, s in open_ranks(record).items()}
            current[rank] = new
            updated, _ = with_nodes(record, current, now)
            return with_event(updated, now, "replaced", f"rank {rank}: {old} replaced by {new}", rank)

        self.update(cluster, change)

    def event(self, cluster: str, kind: str, text: str, rank: int | None = None) -> None:
        now = self.clock()
        self.update(cluster, lambda r: None if r is None else with_event(r, now, kind, text, rank))

    def off_the_bill(self, cluster: str, kind: str, text: str, ranks: Iterable[int] | None = None) -> None:
        """Nodes stopped or lost (every node, or `ranks`): their spans close, with an event."""
        now = self.clock()

        def change(record: dict[str, Any] | None) -> dict[str, Any] | None:
            if record is None:
                return None
            keep = (
                {}
                if ranks is None
                else {r: s[1] for r, s in open_ranks(record).items() if r not in set(ranks)}
            )
            updated, _ = with_nodes(record, keep, now)
            return with_event(updated, now, kind, text)

        self.update(cluster, change)

    def torn_down(self, cluster: str, text: str = "torn down") -> None:
        """Every node off the bill, and the record moved to `ended/` (kept RETAIN_S for cost-report)."""
        now = self.clock()
        key = live_key(cluster)
        for _ in range(_WRITE_ATTEMPTS):
            current = self.store.get(key)
            if current is None or current.data.get("ended_at") is not None:
                return  # never recorded, or ended already (a reader found it gone first)
            record = with_event(closed(current.data, now), now, "torn down", text) | {"ended_at": now}
            ended_key = f"{ENDED_PREFIX}/{int(now * 1000):013d}-{cluster}"
            if self.store.get(ended_key) is None:
                self.store.put(ended_key, record, None)
            # A conditional "delete": the store has none, so the live record says it ended; a provision
            # of the same name then starts a new one (see provisioned).
            if self.store.put(key, record, current.version) is not None:
                self._forget_old(now)
                return

    def _forget_old(self, now: float) -> None:
        """Empty the ended records past RETAIN_S (the store has no delete): one listing, and a write only
        for a record that expired since (the key holds its end time)."""
        for key in self.store.keys(ENDED_PREFIX):
            ended_at = _ended_at(key)
            if ended_at is not None and ended_at < now - RETAIN_S:
                found = self.store.get(key)
                if found is not None and found.data.get("ended_at") is not None:
                    self.store.put(key, {"expired": True}, found.version)


def _ended_at(key: str) -> float | None:
    """The end time an `ended/` key holds (`ended/<ms>-<cluster>`)."""
    stamp = key.rpartition("/")[2].partition("-")[0]
    return int(stamp) / 1000.0 if stamp.isdigit() else None


def current_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Live records only (a record that says it ended is a torn-down cluster's, kept under `ended/`)."""
    return [r for r in records if r.get("ended_at") is None and "cluster" in r]
