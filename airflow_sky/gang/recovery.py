"""What to do when a rank of a running job fails or disappears: the recovery policy, as pure functions.

    a job node is not RUNNING (preempted, terminated, gone)  -> RECOVER: replace it, relaunch every rank
    a rank exited with one of job_recovery.recover_on_exit_codes -> RESTART: relaunch every rank, same nodes
    a rank exited non-zero, restarts on errors left           -> RESTART
    otherwise                                                 -> FAIL (fail-fast: kill the others)

Recoveries (node replacements) are bounded by `max_recoveries` (default 3); restarts on errors by
`job_recovery.max_restarts_on_errors` (SkyPilot's semantics: exit codes listed in `recover_on_exit_codes`
always restart, within `max_recoveries`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from airflow_sky.task import JobRecovery

DEFAULT_MAX_RECOVERIES = 3


class Action(enum.StrEnum):
    RECOVER = "RECOVER"
    RESTART = "RESTART"
    FAIL = "FAIL"


@dataclasses.dataclass(frozen=True)
class RecoveryState:
    """How often the job was relaunched so far (read from the job state)."""

    generation: int = 0
    recoveries: int = 0
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def lost_nodes(ranks: Sequence[int]) -> str:
    """'node of rank 1 lost', 'nodes of ranks 0, 2 lost' (no nested parentheses: messages quote it in some)."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"node of rank {ordered[0]} lost"
    return f"nodes of ranks {', '.join(str(r) for r in ordered)} lost"


def decide(
    unhealthy_ranks: Sequence[int],
    exit_code: int | None,
    policy: JobRecovery,
    state: RecoveryState,
    max_recoveries: int = DEFAULT_MAX_RECOVERIES,
) -> Decision:
    """The action for a fault: `exit_code` is the failing rank's code, None when its process was lost."""
    if unhealthy_ranks:
        lost = lost_nodes(unhealthy_ranks)
        if state.recoveries + state.restarts >= max_recoveries:
            return Decision(Action.FAIL, f"{lost}; gave up after {max_recoveries} recoveries")
        return Decision(Action.RECOVER, lost)
    if exit_code is None:
        return Decision(Action.FAIL, "the job's process disappeared while every node is up")
    if exit_code in policy.recover_on_exit_codes:
        if state.recoveries + state.restarts >= max_recoveries:
            return Decision(Action.FAIL, f"exit code {exit_code}; gave up after {max_recoveries} recoveries")
        return Decision(Action.RESTART, f"exit code {exit_code} is in job_recovery.recover_on_exit_codes")
    if state.restarts < policy.max_restarts_on_errors:
        return Decision(
            Action.RESTART,
            f"restart {state.restarts + 1} of job_recovery.max_restarts_on_errors={policy.max_restarts_on_errors}",
        )
    return Decision(Action.FAIL, f"exit code {exit_code}")
