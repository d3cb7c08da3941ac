"""Shell text that runs on a node, built by pure functions.

Every value that reaches a shell goes through shlex.quote. Env values never appear here: they travel in a
0600 env file inside the tar stream that `start_command` reads from stdin.
"""

from __future__ import annotations

import re
import shlex
import signal

from airflow_sky.node.autostop import TOUCH_ACTIVITY
from airflow_sky.node.paths import JOBS_DIR, MOUNTS_DIR, WORKDIR

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def validate_job_id(job_id: str) -> str:
    """Job ids become directory names on the node: keep them to a safe alphabet."""
    if not _JOB_ID.match(job_id) or ".." in job_id:
        raise ValueError(f"invalid job id {job_id!r}: use letters, digits, '.', '_' and '-' (max 200)")
    return job_id


def job_dir(job_id: str) -> str:
    """The job's directory as a shell word that expands $HOME (the id itself is validated and quoted)."""
    return f'"$HOME"/{JOBS_DIR}/{shlex.quote(validate_job_id(job_id))}'


def generation_dir(job_id: str, generation: int) -> str:
    return f"{job_dir(job_id)}/gen-{int(generation)}"


# Job dirs (logs, results) a node keeps: one per job and phase; older ended ones go when a job starts.
KEPT_JOB_DIRS = 100


def launch_script() -> str:
    """The detached wrapper (launch.sh) for one generation; it runs in the generation dir's parent job dir.

    `$$` is the process group id: setsid made this shell a session leader, and cancellation signals the
    whole group (torchrun and its workers included). The TERM/INT/HUP handler keeps the wrapper alive long
    enough to record the script's exit code; a handler (unlike an ignore) is reset for the children.

    With bucket mounts on the node, the exit code is recorded only once their uploads are done (SkyPilot
    marks a job done after MOUNT_CACHED's cache is uploaded): a flush that fails fails a script that
    succeeded, and its message in the log names the mount.
    """
    return f"""\
d=$(cd "$(dirname "$0")" && pwd)
job=$(dirname "$d")
echo $$ > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"
trap 'true' TERM INT HUP
. "$d/env"
rm -f "$d/env"  # secrets at rest: the env file lives only until the job has read it
export AIRFLOW_SKY_XCOM_DIR="$job/xcom"
export AIRFLOW_SKY_JOB_DIR="$job"
mkdir -p "$HOME/{WORKDIR}" "$AIRFLOW_SKY_XCOM_DIR"
cd "$HOME/{WORKDIR}"
bash "$d/script.sh" >> "$d/log" 2>&1 < /dev/null
ec=$?
if [ -x "$HOME/{MOUNTS_DIR}/flush" ]; then
  "$HOME/{MOUNTS_DIR}/flush" >> "$d/log" 2>&1 < /dev/null || {{ [ "$ec" -ne 0 ] || ec=1; }}
fi
echo "$ec" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
"""


def start_command(job_id: str, generation: int) -> str:
    """Unpack the job files (tar on stdin) and start launch.sh detached, unless this generation already ran.

    Idempotent per (job_id, generation): the `set -C` (noclobber) create of `claimed` lets exactly one
    caller start the generation, so a retried or duplicated start attaches to the job that runs.
    Prints `started <pid>` or `existing <pid>`.
    """
    d = generation_dir(job_id, generation)
    return f"""\
set -eu
umask 077
d={d}
mkdir -p "$d"
{TOUCH_ACTIVITY}
if ( set -C; : > "$d/claimed" ) 2>/dev/null; then
  tar -xf - -C "$d"
  echo {int(generation)} > "$d/../generation"
  : > "$d/log"
  setsid bash "$d/launch.sh" < /dev/null > /dev/null 2>&1 &
  state=started
else
  cat > /dev/null
  state=existing
fi
i=0
while [ ! -s "$d/pid" ] && [ ! -s "$d/exit_code" ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
echo "$state $(cat "$d/pid" 2>/dev/null || echo -)"
{_prune_ended_jobs(KEPT_JOB_DIRS)}
"""


def _prune_ended_jobs(keep: int) -> str:
    """Remove job dirs beyond the newest `keep` whose every generation ended (a kept cluster stays bounded)."""
    return f"""\
( cd "$HOME/{JOBS_DIR}" && ls -1t | tail -n +{int(keep) + 1} | while read -r j; do
    for g in "$j"/gen-*; do [ -e "$g/exit_code" ] || [ ! -e "$g/claimed" ] || continue 2; done
    rm -rf -- "$j"
  done ) >/dev/null 2>&1 || true"""


def poll_command(job_id: str, generation: int, offset: int, max_bytes: int) -> str:
    """Print `<exit_code|-> <alive 0|1> <log size> <pid|->` on one line, then log bytes [offset, offset+max_bytes).

    `max_bytes=0` asks for the state only.

    Liveness is read before the exit code: the wrapper writes the exit code before it exits, so a job seen
    dead with no exit code was really lost (node restarted, wrapper killed).
    """
    if offset < 0 or max_bytes < 0:
        raise ValueError("offset and max_bytes must be >= 0")
    d = generation_dir(job_id, generation)
    return f"""\
d={d}
{TOUCH_ACTIVITY}
if [ ! -d "$d" ]; then echo "missing 0 0 -"; exit 0; fi
alive=0
pid=$(cat "$d/pid" 2>/dev/null || true)
case "$pid" in ''|*[!0-9]*) ;; *) if [ "$pid" -gt 1 ] && kill -0 -- "-$pid" 2>/dev/null; then alive=1; fi;; esac
ec=-
if [ -s "$d/exit_code" ]; then ec=$(cat "$d/exit_code"); fi
size=$(stat -c %s "$d/log" 2>/dev/null || echo 0)
echo "$ec $alive $size ${{pid:--}}"
""" + (
        f'tail -c +{int(offset) + 1} "$d/log" 2>/dev/null | head -c {int(max_bytes)} || true\n'
        if max_bytes
        else ""
    )


def kill_command(
    job_id: str, generation: int, sig: signal.Signals, grace_s: float, record_exit_code: int
) -> str:
    """Signal the job's process group, SIGKILL it after `grace_s`, and record an exit code if none was written."""
    d = generation_dir(job_id, generation)
    ticks = max(1, int(grace_s * 10))
    return f"""\
d={d}
pid=$(cat "$d/pid" 2>/dev/null || true)
case "$pid" in ''|*[!0-9]*|0|1) echo none; exit 0;; esac
kill -{int(sig)} -- "-$pid" 2>/dev/null || true
i=0
while kill -0 -- "-$pid" 2>/dev/null && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done
kill -9 -- "-$pid" 2>/dev/null || true
if [ ! -s "$d/exit_code" ]; then echo {int(record_exit_code)} > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"; fi
echo "killed $(cat "$d/exit_code")"
"""


def current_generation_command(job_id: str) -> str:
    return f"cat {job_dir(job_id)}/generation 2>/dev/null || echo -"


def record_failure_command(job_id: str, generation: int, rank: int, exit_code: int) -> str:
    """Record which rank failed first (noclobber: the first writer wins) and print the recorded cause.

    Every follower of a phase asks the head for this one record, so all of them name the same culprit even
    when several see failures at once (the others' exits are the kills that followed).
    """
    d = generation_dir(job_id, generation)
    return f"""\
d={d}
mkdir -p "$d"
( set -C; echo "{int(rank)} {int(exit_code)}" > "$d/failure" ) 2>/dev/null || true
cat "$d/failure"
"""


def claim_command(job_id: str, generation: int) -> str:
    """Claim the lead of the relaunch to `generation` (mkdir is atomic: exactly one caller prints `won`)."""
    d = job_dir(job_id)
    return (
        f"mkdir -p {d} && if mkdir {d}/lead-{int(generation)} 2>/dev/null; then echo won; else echo lost; fi"
    )
