"""Acting on a preemption notice, on the node, inside the job's wrapper (launch.sh).

Clouds warn before they take a spot node (AWS 2 minutes, GCP 30 seconds, a local node whatever `local
preempt --notice` gave it). A watcher runs beside every run generation whose infra gives notices: it asks
the infra's check (`Cloud.notice_check`: the metadata service, or the local stand-in) every few seconds and,
on a notice:

1. writes `$AIRFLOW_SKY_JOB_DIR/notice` ({"preempt_at": <epoch s>, "seen_at": <epoch s>}), for a job that
   would rather look than trap a signal;
2. runs the task's `preemption` hooks in declaration order, each bounded by its timeout (the hooks' output
   goes to the job's log, prefixed, and to `gen-<g>/hooks/preemption-<i>.log` with its exit status and
   seconds in `.rc`, which the worker keeps for `logs --hook`);
3. sends the job's process group SIGTERM, so a training loop can write its checkpoint (the SIGKILL is the
   node going at its deadline).

The watcher only acts on its own job: what it finds at the check is data (a number, read bounded). The
worker never believes any of it: whether the node is being preempted is the infra's word (NodeStatus
PREEMPTING), and recovery follows that.
"""

from __future__ import annotations

import dataclasses

from airflow_sky.task.hooks import HOOK_EVENT_ENV

NOTICE_FILE = "notice"  # in the job dir: $AIRFLOW_SKY_JOB_DIR/notice
HOOKS_DIR = "hooks"  # in the generation dir: the preemption hooks' scripts, logs and verdicts
DEFAULT_INTERVAL_S = 2.0  # AWS asks to poll every 5 s; a local or GCP notice leaves less time
_KILL_AFTER_S = 5  # a hook past its timeout gets SIGTERM, then SIGKILL this much later (timeout -k)


@dataclasses.dataclass(frozen=True)
class NoticeWatch:
    """How a run generation watches for its node's preemption notice."""

    check: str  # shell: prints the epoch second the node goes at, once a notice is out; nothing before
    hook_timeouts: tuple[
        int, ...
    ] = ()  # the preemption hooks' timeouts; their scripts travel in the job's tar
    interval_s: float = DEFAULT_INTERVAL_S


def hook_script_name(index: int) -> str:
    """A preemption hook's script in the generation dir (1-based, as users count hooks)."""
    return f"{HOOKS_DIR}/preemption-{int(index)}.sh"


def notice_function(watch: NoticeWatch, run_words: str = "bash") -> str:
    """The shell function `sky_notice <pid of the job's script>` for launch.sh (see the module doc).

    `run_words`: how a hook script is run (in the node's container, for a containerized job)."""
    hooks = "".join(
        f"""\
    s=$(date +%s); echo "(preemption hook {i}) started" >> "$d/log"
    timeout -k {_KILL_AFTER_S} {int(t)} {run_words} "$d/{hook_script_name(i)}" < /dev/null 2>&1 \\
      | tee "$d/{HOOKS_DIR}/preemption-{i}.log" | sed -u 's/^/(preemption hook {i}) /' >> "$d/log"
    rc=${{PIPESTATUS[0]}}; echo "$rc $(( $(date +%s) - s ))" > "$d/{HOOKS_DIR}/preemption-{i}.rc"
    echo "(preemption hook {i}) exited $rc" >> "$d/log"
"""
        for i, t in enumerate(watch.hook_timeouts, start=1)
    )
    return f"""\
sky_notice() {{
  trap 'true' TERM INT HUP  # the job's SIGTERM below is for the job (a handler: children get the default)
  # Waits are `read -t` on a pipe nobody writes: no `sleep` process a round (one that a job's own
  # processes could be mistaken for, or counted with).
  local tick; exec {{tick}}<> <(:)
  while kill -0 "$1" 2>/dev/null; do
    at=$( {{ {watch.check} ; }} 2>/dev/null ); at=${{at:0:32}}; at=${{at//[!0-9]/}}  # one fork a round
    if [ -z "$at" ]; then read -rt {watch.interval_s:g} -u "$tick" _ || true; continue; fi
    touch "$d/.notice"
    echo "{{\\"preempt_at\\": $at, \\"seen_at\\": $(date +%s)}}" > "$job/{NOTICE_FILE}.tmp" \\
      && mv -f -- "$job/{NOTICE_FILE}.tmp" "$job/{NOTICE_FILE}"
    echo "[airflow-sky] preemption notice: this node goes in $(( at - $(date +%s) )) s; \\
{len(watch.hook_timeouts)} preemption hook(s), then SIGTERM to the job" >> "$d/log"
    mkdir -p "$d/{HOOKS_DIR}"
    export {HOOK_EVENT_ENV}=preemption
{hooks}    kill -TERM -- -$$ 2>/dev/null
    return 0
  done
}}
"""


def hook_files(scripts: tuple[str, ...]) -> dict[str, str]:
    """The preemption hooks' scripts by their place in the generation dir."""
    return {hook_script_name(i): script for i, script in enumerate(scripts, start=1)}
