"""What `airflow-sky launch` prints while a job runs, and the summary at its end (rich).

Text from nodes, errors, job records and users (a log line, a failure's message, a relaunch reason, a
cluster name) is printed as rich Text, never parsed as markup: `[/]` or `[bold` in it is shown as written.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.status import Status
from rich.text import Text

from airflow_sky.client.cli.exit_summary import exit_code_lines
from airflow_sky.client.cli.live_progress import ProgressLine
from airflow_sky.client.cli.tables import Column, fitted_table
from airflow_sky.client.engine import JobOutcome
from airflow_sky.client.events import Event
from airflow_sky.gang.job_status import of_launch

_STEP_TITLES = {
    "provision": "Provisioning nodes",
    "sync": "Syncing workdir and file mounts",
    "setup_follow": "Running setup",
    "launch": "Launching the run",
    "run_follow": "Running",
    "collect": "Collecting results",
    "teardown": "Tearing down",
}
_RANK_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green")


class ProgressPrinter:
    """Listener for engine events: node-prefixed log lines, phase headers, a live status on a terminal."""

    def __init__(
        self,
        console: Console,
        down: bool = True,
        new_nodes: bool = True,
        setup: bool = True,
        runs_nothing: bool = False,
    ) -> None:
        """`down`: the cluster goes down after the job (else "Tearing down" is never shown); `new_nodes`:
        the launch may provision (an exec only uses the nodes there are); `setup`: the job runs a setup
        (each node's sync task starts it); `runs_nothing`: `launch -c C` alone (the cluster is the point:
        no job is named, no phase but provisioning is announced)."""
        self.console = console
        self._titles = dict(_STEP_TITLES)
        if setup:
            self._titles["sync"] = "Syncing workdir and file mounts, then running setup"
        if not down:
            self._titles["teardown"] = "Finishing (the cluster is kept)"
        if not new_nodes:
            self._titles["provision"] = "Checking the cluster's nodes"
        # A phase's header comes with the task that starts its scripts (sync starts setup, launch the run):
        # node lines are read from then on.
        self._headers = {"sync", "launch"} if not runs_nothing else set()
        self._headers |= {"provision"} if new_nodes else set()
        self._headers |= {"teardown"} if down else set()
        self._runs_nothing = runs_nothing
        self._seen_steps: set[str] = set()
        self._told_exits: set[str] = set()  # one line per verdict: the killed ranks all repeat the cause
        self._done: dict[str, int] = {}
        self._nodes = 0
        self._progress = ProgressLine(console)  # the ranks' reports, as one line (no report line is shown)
        self._status: Status | None = console.status("") if console.is_terminal else None
        if self._status is not None:
            self._status.start()

    def close(self) -> None:
        self._progress.end()
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, event: Event) -> None:
        if event.kind == "task_started" and event.step in ("collect", "teardown"):
            self._progress.end()  # the run is over: its last progress line before what follows it
        if event.kind == "job":
            nodes = event.data["nodes"]
            self._nodes = len(nodes)
            ips = ", ".join(n["internal_ip"] for n in nodes)
            if not self._runs_nothing:  # (a launch that runs nothing says its cluster at its end)
                self.console.print(
                    Text.assemble(
                        (f"Job {event.data['job_id']}", "bold"),
                        " on cluster ",
                        (str(event.data["cluster_name"]), "bold"),
                        f" ({event.data['infra']}): {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({ips})",
                    ),
                    highlight=False,
                )
        elif event.kind == "task_started" and event.step not in self._seen_steps:
            self._seen_steps.add(event.step)
            if event.step in self._headers:
                title = self._titles.get(event.step, event.step)
                self.console.print(Text(f"⚙ {title}", style="bold blue"))
        elif event.kind == "task_done":
            self._done[event.step] = self._done.get(event.step, 0) + 1
        elif event.kind == "progress":
            self._progress.update(event.data)
        elif event.kind == "log":
            style = _RANK_STYLES[(event.rank or 0) % len(_RANK_STYLES)]
            prefix, _, rest = event.text.partition(") ")
            line = Text(prefix + ")", style=style)
            line.append(" " + rest)
            self.console.print(line, highlight=False, soft_wrap=True)
        elif event.kind == "queued":
            self.console.print(Text(f"⏳ {event.text}", style="bold yellow"), highlight=False)
        elif event.kind == "relaunch":
            self._told_exits.clear()  # a new generation's verdicts are news again
            self.console.print(Text(f"⟳ {event.text}", style="bold yellow"), highlight=False)
        elif event.kind == "task_failed" and not event.step.endswith("_follow"):
            first = event.text.splitlines()[0] if event.text else ""
            self.console.print(Text(f"✗ {event.step} failed: {first}", style="red"))
        elif event.kind == "exit" and event.exit_code not in (0, None):
            first = event.text.splitlines()[0] if event.text else str(event.exit_code)
            if first not in self._told_exits:  # each killed rank says "killed: rank R failed ..."
                self._told_exits.add(first)
                self.console.print(Text(f"✗ {first}", style="red"), highlight=False)
        self._update_status(event)

    def _update_status(self, event: Event) -> None:
        if self._status is None:
            return
        title = self._titles.get(event.step, event.step)
        done = self._done.get(event.step, 0)
        suffix = f" ({done}/{self._nodes} nodes done)" if self._nodes and event.rank is not None else ""
        if event.step == "run_follow" and self._progress.line:
            suffix += f" · {self._progress.line}"
        self._status.update(Text(f"{title}{suffix}"))


def print_summary(
    console: Console, outcome: JobOutcome, started_at: float, status: str | None = None
) -> None:
    """The steps' durations, exit codes, and a last line naming the job's status as `queue` shows it."""
    rows = [
        [step, f"{end - start:.1f}s" if end is not None else "failed"]
        for step, (start, end) in outcome.step_times.items()
    ]
    rows.append(["total", f"{time.time() - started_at:.1f}s"])
    columns = (Column("step", name=True), Column("duration", justify="right"))
    console.print(fitted_table(columns, rows, console.width, title="Summary", show_edge=False))
    for phase in ("setup", "run"):
        # Wrapped here: the launch's console soft-wraps (a node's log line is never cut).
        for line in exit_code_lines(phase, outcome.exit_codes.get(phase) or {}, console.width):
            console.print(line, highlight=False, markup=False)
    cost = cost_line_of(outcome, started_at)
    if cost is not None:
        console.print(cost, highlight=False, markup=False)
    job = f"Job {outcome.job_id}" if outcome.job_id is not None else "Job"
    status = status or job_status_of(outcome)
    if outcome.succeeded:
        console.print(Text(f"✓ {job} on {outcome.cluster_name} {status}", style="bold green"))
    else:
        # The culprit's own message ("rank 1 failed with exit code 4; ...") before its siblings' "killed: ...".
        failures = sorted(outcome.failures, key=lambda f: f.startswith("killed:"))
        reason = failures[0].splitlines()[0] if failures else f"DAG run {outcome.state}"
        console.print(
            Text(f"✗ {job} on {outcome.cluster_name} {status}: {reason}", style="bold red"), highlight=False
        )
    what = "Airflow log of this launch" if outcome.by_airflow else "Log of this exec"  # exec: no DAG run
    console.print(Text(f"{what}: {outcome.log_file}", style="dim"), highlight=False)


def cost_line_of(outcome: JobOutcome, started_at: float) -> str | None:
    """The launch's `Cost: ...` line (its nodes' time since it started, at the catalog's price), from the
    fleet ledger; None where nothing is billed by the hour (local, ssh pools) or the ledger has no record."""
    from airflow_sky.infra import ledger
    from airflow_sky.infra.registry import open_cluster

    handle = outcome.handle
    if handle is None:
        return None
    try:
        record = open_cluster(handle.cluster_name, handle.infra).ledger_record()
    except Exception:  # the summary goes on without its cost line
        return None
    if not record or not record.get("billing"):
        return None
    return ledger.cost_line(ledger.summary(record, time.time(), since=started_at))


def job_status_of(outcome: JobOutcome) -> str:
    """The job's status as `airflow-sky queue` names it, from what the launch saw (the cluster may be gone)."""
    setup_codes = outcome.exit_codes.get("setup") or {}
    return of_launch(outcome.succeeded, setup_codes, outcome.failures).value
