"""A job's progress, as its ranks report it: per node rank the latest report and a bounded history, kept
where the job state lives (the infra's StateStore), and the summary every reader shows.

One record per node rank (`progress/<job id>/<rank>`), written only by the follow of that rank (the
follower that reads the rank's log anyway: collecting costs no extra connection), at most every
WRITE_INTERVAL_S and once more when the rank's log ends. A rank's record outlives its generation: the
follower of a relaunched generation goes on with the same record, so the history shows the recovery.

`summarize(ranks, state, now)` turns the records and the job state into the one JSON document the Airflow
view, `airflow-sky queue`, the SDK and the job's final XCom show (PROGRESS_VERSION names its shape):

    {"version": 1, "job_id", "status", "generation", "num_nodes", "reported_ranks",
     "step", "total", "percent", "rate", "eta_s", "slowest_rank", "updated_at", "metrics",
     "ranks": [{"rank", "generation", "process", "step", "total", "rate", "metrics", "updated_at", "age_s",
                "stale", "history": [[time, step, generation, {metric: value}], ...]}],
     "recoveries": [{"generation", "action", "reason", "ranks", "fault_at", "at", "resumed_at",
                     "lost_s", "steps_redone", "notice_at"?, "preempt_at"?}],
     "goodput": {"wall_s", "to_start_s", "to_first_step_s", "productive_s", "lost_s", "steps_redone",
                 "ratio"} (gang.goodput; None without a submit time)}

The job's step is its slowest rank's (a DDP step is done when every rank did it), and so are its rate and
ETA. Everything here is pure; gang.progress_store keeps the records and collects them while following.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from airflow_sky.gang.state_record import NOTICES_INFO_KEY, JobState
from airflow_sky.progress import MAX_METRICS, Report

PROGRESS_VERSION = 1
HISTORY_POINTS = 120  # a rank's history keeps about this many points: the newest half whole, older thinned
HISTORY_METRICS = 6  # the metrics a history point keeps (the first reported names); the latest keeps all
RATE_WINDOW_S = 60.0  # a rank's rate is taken over its points of the last minute (of its generation)
STALE_AFTER_S = 120.0  # a running rank that reported nothing for this long is marked stale


# ---- one rank's record (pure) -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a rank's history: when, which step, in which generation, and some metrics."""

    time: float
    step: int
    generation: int
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def to_list(self) -> list[Any]:
        return [self.time, self.step, self.generation, dict(self.metrics)]

    @classmethod
    def from_list(cls, data: list[Any]) -> Point:
        return cls(float(data[0]), int(data[1]), int(data[2]), dict(data[3] or {}) if len(data) > 3 else {})


@dataclasses.dataclass(frozen=True)
class RankProgress:
    """What node rank `rank` last reported, and its history (every generation it ran)."""

    rank: int
    generation: int
    step: int
    time: float  # when the latest report was made (its own `time`, else when it was read)
    total: int | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    process: int | None = None  # the reporting process's global rank (torchrun's RANK), when it said
    history: tuple[Point, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "generation": self.generation,
            "step": self.step,
            "time": self.time,
            "total": self.total,
            "metrics": dict(self.metrics),
            "process": self.process,
            "history": [p.to_list() for p in self.history],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankProgress:
        return cls(
            rank=int(data["rank"]),
            generation=int(data.get("generation") or 0),
            step=int(data["step"]),
            time=float(data["time"]),
            total=int(data["total"]) if data.get("total") is not None else None,
            metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()},
            process=int(data["process"]) if data.get("process") is not None else None,
            history=tuple(Point.from_list(p) for p in data.get("history") or ()),
        )


def _rounded(value: float) -> float:
    """`value` to 6 significant digits: a chart needs no more, and the record stays small."""
    return float(f"{value:.6g}")


def thin(history: tuple[Point, ...], limit: int = HISTORY_POINTS) -> tuple[Point, ...]:
    """At most about `limit` points: over it, the older half keeps every other point (the newest stay
    whole), so a long run keeps its shape from the first step in bounded space."""
    if len(history) <= limit:
        return history
    half = limit // 2
    older, newer = history[:-half], history[-half:]
    return older[::2] + newer


def with_report(
    current: RankProgress | None, rank: int, generation: int, report: Report, read_at: float
) -> RankProgress | None:
    """`current` with `report` (one line of node rank `rank`'s log, in `generation`) applied; None when
    the report does not count: another process of the node than the one it follows (a node's lowest
    process rank is the one followed), or a generation older than the record's."""
    if current is not None and generation < current.generation:
        return None
    process = report.rank
    followed = current.process if current is not None and generation == current.generation else None
    if followed is not None and process is not None and process > followed:
        return None  # a second process on this node: its steps are the same steps
    when = report.time if report.time is not None else read_at
    reported = {name: _rounded(value) for name, value in report.metrics.items()}
    kept = dict(list(reported.items())[:HISTORY_METRICS])  # a point holds what was reported at its step
    # The latest value of every metric stays until a newer one comes (a loss reported every 25 steps, the
    # step every step), across generations too; at most MAX_METRICS names, the first reported kept.
    metrics = dict(current.metrics) if current is not None else {}
    for name, value in reported.items():
        if name in metrics or len(metrics) < MAX_METRICS:
            metrics[name] = value
    point = Point(round(when, 3), report.step, generation, kept)  # a Unix time: to the millisecond
    history = current.history if current is not None else ()
    if history and history[-1].generation == generation and history[-1].step == report.step:
        history = history[:-1]  # the same step reported again (a final report): keep the newest values
    return RankProgress(
        rank=rank,
        generation=generation,
        step=report.step,
        time=when,
        total=report.total if report.total is not None else (current.total if current else None),
        metrics=metrics,
        process=process if current is None or generation != current.generation else _lowest(current, process),
        history=thin((*history, point)),
    )


def _lowest(current: RankProgress, process: int | None) -> int | None:
    if current.process is None:
        return process
    if process is None:
        return current.process
    return min(current.process, process)


def rank_rate(progress: RankProgress, window_s: float = RATE_WINDOW_S) -> float | None:
    """Steps per second of the rank's current generation over its last `window_s` (None: too few points)."""
    points = [p for p in progress.history if p.generation == progress.generation]
    if len(points) < 2:
        return None
    last = points[-1]
    recent = [p for p in points if last.time - p.time <= window_s]
    first = recent[0] if len(recent) >= 2 else points[-2]
    elapsed = last.time - first.time
    if elapsed <= 0 or last.step < first.step:
        return None
    return (last.step - first.step) / elapsed


# ---- the job's summary (pure) -------------------------------------------------------------------------


def summarize(
    ranks: Mapping[int, RankProgress], state: JobState | None, now: float, with_history: bool = True
) -> dict[str, Any]:
    """The progress document of a job (the module's docstring shows it); `with_history=False` leaves the
    per-rank histories out (a table, a gauge, a queue line)."""
    generation = (
        state.generation if state is not None else max((r.generation for r in ranks.values()), default=0)
    )
    running = state is None or not state.status.is_terminal
    rows: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        progress = ranks[rank]
        rate = rank_rate(progress)
        age = max(0.0, now - progress.time)
        row: dict[str, Any] = {
            "rank": rank,
            "generation": progress.generation,
            "process": progress.process,
            "step": progress.step,
            "total": progress.total,
            "rate": rate,
            "metrics": dict(progress.metrics),
            "updated_at": progress.time,
            "age_s": age,
            "stale": running and (age > STALE_AFTER_S or progress.generation < generation),
        }
        if with_history:
            row["history"] = [p.to_list() for p in progress.history]
        rows.append(row)
    current = [r for r in rows if r["generation"] == generation] or rows
    doc: dict[str, Any] = {
        "version": PROGRESS_VERSION,
        "job_id": state.job_id if state is not None else None,
        "status": state.status.value if state is not None else None,
        "generation": generation,
        "num_nodes": state.num_nodes if state is not None else len(ranks),
        "reported_ranks": len(ranks),
        "step": None,
        "total": None,
        "percent": None,
        "rate": None,
        "eta_s": None,
        "slowest_rank": None,
        "updated_at": max((r["updated_at"] for r in rows), default=None),
        "metrics": {},
        "ranks": rows,
        "recoveries": recoveries(state, ranks, now) if state is not None else [],
    }
    if state is not None:
        from airflow_sky.gang.goodput import goodput  # it reads this module's records

        doc["goodput"] = goodput(state, ranks, doc["recoveries"], now)
    if not current:
        return doc
    slowest = min(current, key=lambda r: (r["step"], r["rate"] if r["rate"] is not None else math.inf))
    totals = [r["total"] for r in current if r["total"]]
    total = max(totals) if totals else None
    doc.update(step=slowest["step"], total=total, rate=slowest["rate"], metrics=dict(current[0]["metrics"]))
    if len(current) > 1:
        doc["slowest_rank"] = slowest["rank"]
    if total:
        doc["percent"] = min(100.0, 100.0 * slowest["step"] / total)
        if slowest["rate"] and running:
            doc["eta_s"] = max(0.0, (total - slowest["step"]) / slowest["rate"])
    return doc


def recoveries(state: JobState, ranks: Mapping[int, RankProgress], now: float) -> list[dict[str, Any]]:
    """The job's relaunches (the record's history) with what each cost: `lost_s` runs from the fault to the
    moment every rank of the new generation was back at the step the old one had reached (still counting
    while it is not: `resumed_at` None), `steps_redone` the steps done again."""
    points = [p for r in ranks.values() for p in r.history]
    out: list[dict[str, Any]] = []
    for entry in state.history:
        generation = int(entry.get("generation") or 0)
        at = float(entry.get("at") or 0.0)
        fault_at = float(entry.get("claimed_at") or at)
        before = [p.step for p in points if p.generation == generation - 1]
        reached = max(before) if before else None
        resumed_at = _back_at(ranks, generation, reached) if reached is not None else None
        first = [p for p in points if p.generation == generation]
        restart_step = min((p.step for p in first), default=None)
        if reached is None:
            lost = at - fault_at  # no progress reported: the time the relaunch took
        else:
            lost = (resumed_at if resumed_at is not None else now) - fault_at
        out.append(
            {
                "generation": generation,
                "action": entry.get("action"),
                "reason": entry.get("reason"),
                "ranks": list(entry.get("replaced_ranks") or ()),
                "fault_at": fault_at,
                "at": at,
                "resumed_at": resumed_at,
                "lost_s": max(0.0, lost),
                "steps_redone": _redone(ranks, generation)
                if reached is not None and restart_step is not None
                else None,
                **_notice(state, generation - 1),
            }
        )
    return out


def _redone(ranks: Mapping[int, RankProgress], generation: int) -> int:
    """The steps generation `generation` did again: per rank, from where it resumed to where it had been
    (DDP ranks move in lockstep, so this is the job's; ranks that resume from checkpoints of their own may
    not), the most of any rank that reported in both generations."""
    redone = [
        max(p.step for p in mine if p.generation == generation - 1)
        - min(p.step for p in mine if p.generation == generation)
        for mine in (r.history for r in ranks.values())
        if any(p.generation == generation - 1 for p in mine) and any(p.generation == generation for p in mine)
    ]
    return max([0, *redone])


def _notice(state: JobState, generation: int) -> dict[str, Any]:
    """A recovery's preemption notice (the infra's, recorded by the watcher): when it was seen and when the
    node was to go; nothing for a loss without one."""
    notices = [n for n in state.info.get(NOTICES_INFO_KEY) or () if n.get("generation") == generation]
    if not notices:
        return {}
    return {
        "notice_at": min(float(n.get("seen_at") or 0) for n in notices),
        "preempt_at": min(float(n.get("preempt_at") or 0) for n in notices),
    }


def _back_at(ranks: Mapping[int, RankProgress], generation: int, step: int) -> float | None:
    """When every rank that reported in `generation` first reached `step` in it (None: one has not yet)."""
    times: list[float] = []
    for progress in ranks.values():
        reached = [p.time for p in progress.history if p.generation == generation and p.step >= step]
        mine = [p for p in progress.history if p.generation == generation]
        if not mine:
            continue
        if not reached:
            return None
        times.append(min(reached))
    return max(times) if times else None


def final_metrics(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The small part of a progress document a job's XCom keeps: the job's step, total and metrics, each
    rank's last step and metrics, and the recoveries (no histories)."""
    return {
        "version": doc.get("version", PROGRESS_VERSION),
        "step": doc.get("step"),
        "total": doc.get("total"),
        "metrics": doc.get("metrics") or {},
        "generation": doc.get("generation"),
        "ranks": [
            {"rank": r["rank"], "step": r["step"], "metrics": r["metrics"]} for r in doc.get("ranks") or ()
        ],
        "goodput": doc.get("goodput"),
        "recoveries": [
            {
                k: v
                for k, v in r.items()
                if k in ("generation", "action", "ranks", "lost_s", "steps_redone", "notice_at", "preempt_at")
            }
            for r in doc.get("recoveries") or ()
        ],
    }
