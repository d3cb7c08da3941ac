"""Shell text that runs on a node, built by pure functions.

Every value that reaches a shell goes through shlex.quote. Env values never appear here: they travel in a
0600 env file inside the tar stream that `start_command` reads from stdin.

Trust line: the job runs as the node's user and can rewrite everything under its job dir (pid, exit code,
launch.sh itself) and under ~/.airflow_sky. Nothing here executes a file a job could have planted (launch.sh
is parsed whole before the job starts, and the mounts' flush is inline in it), and nothing is signalled by
a pid a job could have written: every process of a job carries JOB_MARK_ENV=<job id>/gen-<g> in its
environment from the start, which only the job's own processes can have, and cancellation signals the
processes found by that entry (and the process groups they lead), never the pid file.
"""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Sequence

from airflow_sky.node.autostop import TOUCH_ACTIVITY
from airflow_sky.node.container import exec_words, launch_prelude
from airflow_sky.node.notice import NoticeWatch, notice_function
from airflow_sky.node.paths import JOBS_DIR, WORKDIR
from airflow_sky.node.processes import JOB_MARK_ENV, MARKED, SIGNAL_MARKED, end_marked_command
from airflow_sky.node.python_lib import LIB_DIR
from airflow_sky.node.rclone import FlushedMount, flush_function
from airflow_sky.node.shell_reads import READ_SMALL, READ_TIMEOUT_S
from airflow_sky.task.hooks import HOOK_EVENT_ENV

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


def job_mark(job_id: str, generation: int) -> str:
    """The environment entry every process of one generation of a job carries (`KEY=<job id>/gen-<g>`).

    The worker derives it from what it holds (the job id and generation), never from a node file; ids are
    unique among a cluster's jobs, and a node serves one cluster at a time."""
    return f"{JOB_MARK_ENV}={validate_job_id(job_id)}/gen-{int(generation)}"


# Job dirs (logs, results) a node keeps: one per job and phase; older ended ones go when a job starts.
KEPT_JOB_DIRS = 100


# What a job in a container gets from its wrapper besides its env file's names (node.container.exec_words).
CONTAINER_ENV = (
    "HOME",
    JOB_MARK_ENV,
    "AIRFLOW_SKY_XCOM_DIR",
    "AIRFLOW_SKY_JOB_DIR",
    "AIRFLOW_SKY_PYTHONPATH",
    "PYTHONPATH",
    "CUDA_VISIBLE_DEVICES",  # a local node's share of the host's GPUs
    "NVIDIA_VISIBLE_DEVICES",
)


def launch_script(
    flush: Sequence[FlushedMount] = (),
    container: str | None = None,
    env_names: Sequence[str] = (),
    notice: NoticeWatch | None = None,
) -> str:
    """The detached wrapper (launch.sh) for one generation; it runs in the generation dir's parent job dir.

    `$$` is the process group id: setsid made this shell a session leader, and cancellation signals the
    whole group (torchrun and its workers included). The TERM/INT/HUP handler keeps the wrapper alive long
    enough to record the script's exit code; a handler (unlike an ignore) is reset for the children.

    With bucket mounts (`flush`, the job's own MOUNT and MOUNT_CACHED mounts, as the worker knows them),
    the exit code is recorded only once their uploads are done (SkyPilot marks a job done after
    MOUNT_CACHED's cache is uploaded): a flush that fails fails a script that succeeded, and its message in
    the log names the mount. The flush is written here, for this job: nothing on the node's disk is run.

    The whole wrapper is one function, parsed before anything runs: bash reads a script file as it goes,
    and the job can reach this file ($AIRFLOW_SKY_JOB_DIR).

    With `container` (the node's container, node.container), the script runs inside it, with the env
    file's `env_names` and the wrapper's own variables passed by name; the wrapper itself stays here.

    With `notice`, a watcher beside the script acts on the node's preemption notice (node.notice); the
    script then runs in the background and the wrapper waits for it (through the signals it traps).
    """
    flush_call = (
        f'  sky_flush {" ".join(shlex.quote(w) for m in flush for w in m.words())} >> "$d/log" 2>&1 '
        '< /dev/null || { [ "$ec" -ne 0 ] || ec=1; }\n'
        if flush
        else ""
    )
    run_line = '  bash "$d/script.sh" >> "$d/log" 2>&1 < /dev/null\n'
    hook_words = "bash"
    if container is not None:
        run_words = exec_words(container, [*CONTAINER_ENV, *env_names]) + " /bin/bash"
        run_line = (
            launch_prelude(container) + f'\n  {run_words} "$d/script.sh" >> "$d/log" 2>&1 < /dev/null\n'
        )
        hook_words = exec_words(container, [*CONTAINER_ENV, *env_names, HOOK_EVENT_ENV]) + " /bin/bash"
    if notice is not None:
        run_line = run_line[:-1] + _WATCHED_RUN
    return (
        (notice_function(notice, hook_words) + "\n" if notice is not None else "")
        + (flush_function() + "\n" if flush else "")
        + f"""\
sky_launch() {{
  d=$(cd "$(dirname "$0")" && pwd)
  job=$(dirname "$d")
  mark=${{{JOB_MARK_ENV}-}}
  echo $$ > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"
  trap 'true' TERM INT HUP
  . "$d/env"
  rm -f "$d/env"  # secrets at rest: the env file lives only until the job has read it
  export {JOB_MARK_ENV}="$mark"  # after the env file: a task env of that name does not unmark the job
  export AIRFLOW_SKY_XCOM_DIR="$job/xcom"
  export AIRFLOW_SKY_JOB_DIR="$job"
  # airflow_sky.progress for any Python the job runs (node.python_lib); last, so the job's own paths win.
  export AIRFLOW_SKY_PYTHONPATH="$d/{LIB_DIR}"
  export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}$AIRFLOW_SKY_PYTHONPATH"
  mkdir -p "$HOME/{WORKDIR}" "$AIRFLOW_SKY_XCOM_DIR"
  cd "$HOME/{WORKDIR}"
{run_line}  ec=$?
{flush_call}  # A job can reach this dir: whatever it left at exit_code gives way to the real one.
  [ -f "$d/exit_code" ] && [ ! -L "$d/exit_code" ] || rm -rf -- "$d/exit_code"
  echo "$ec" > "$d/exit_code.tmp" && mv -T -- "$d/exit_code.tmp" "$d/exit_code"
}}
sky_launch "$@"; exit
"""
    )


# The script in the background beside the notice watcher; `wait` ends early on each signal the wrapper
# traps, so it is asked again while the script lives. The watcher is let finish once it acted on a notice.
_WATCHED_RUN = """ &
  child=$!
  sky_notice "$child" &
  watcher=$!
  wait "$child"; ec=$?
  while kill -0 "$child" 2>/dev/null; do wait "$child"; ec=$?; done
  if [ -e "$d/.notice" ]; then wait "$watcher"; else kill -KILL "$watcher" 2>/dev/null; fi
  (exit "$ec")
"""

UNPACKED_MARKER = "unpacked"  # the last member of the job's tar stream (jobs.job_files)


def start_command(job_id: str, generation: int) -> str:
    """Unpack the job files (tar on stdin) and start launch.sh detached, unless this generation already ran.

    Idempotent per (job_id, generation), and a start that fails half-way is never adopted: the files are
    unpacked into a staging dir of this attempt (`.stage-<g>-<pid>`), and the generation dir appears only
    by renaming the complete stage onto it, `claimed` inside: the claim is the last step. A rename onto an
    existing generation fails, so exactly one caller starts it and a retried or duplicated start attaches.
    A stage left by an attempt whose shell is gone (a dropped session, a full disk) is removed, and a
    generation dir without a claim (left by an older version) is set aside, so the next attempt starts it.
    Prints `started <pid>` or `existing <pid>`.
    """
    g = int(generation)
    d = generation_dir(job_id, g)
    mark = shlex.quote(job_mark(job_id, g))
    return f"""\
set -eu
umask 077
{READ_SMALL}
job={job_dir(job_id)}
d={d}
mkdir -p "$job"
{TOUCH_ACTIVITY}
for s in "$job"/.stage-{g}-*; do
  [ -d "$s" ] || continue
  kill -0 "${{s##*-}}" 2>/dev/null || rm -rf -- "$s"
done
if [ -d "$d" ] && [ ! -e "$d/claimed" ] && mv -T -- "$d" "$job/.stage-{g}-$$-old" 2>/dev/null; then
  if [ -e "$job/.stage-{g}-$$-old/claimed" ]; then
    mv -T -- "$job/.stage-{g}-$$-old" "$d" 2>/dev/null || true  # a winner landed in between: give it back
  fi
  rm -rf -- "$job/.stage-{g}-$$-old"
fi
state=existing
if [ ! -e "$d/claimed" ]; then
  stage="$job/.stage-{g}-$$"
  trap 'rm -rf -- "$stage"' EXIT
  mkdir "$stage"
  tar -xf - -C "$stage"
  [ -e "$stage/{UNPACKED_MARKER}" ] || {{ echo "the job's files arrived incomplete" >&2; exit 1; }}
  rm -f -- "$stage/{UNPACKED_MARKER}"
  : > "$stage/log"
  : > "$stage/claimed"
  trap '' HUP  # the claim and the launch go together: a session dropped now must not split them
  if mv -T -- "$stage" "$d" 2>/dev/null; then
    trap - EXIT
    ( trap - HUP; export {mark}; exec setsid bash "$d/launch.sh" < /dev/null > /dev/null 2>&1 ) &
    state=started
  fi
  trap - HUP
fi
[ "$state" = started ] || cat > /dev/null
i=0
while [ ! -s "$d/pid" ] && [ ! -s "$d/exit_code" ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
echo "$state $(small "$d/pid" || echo -)"
{_prune_ended_jobs(KEPT_JOB_DIRS)}
"""


def _prune_ended_jobs(keep: int) -> str:
    """Remove job dirs beyond the newest `keep` whose every generation ended (a kept cluster stays bounded)."""
    return f"""\
( cd "$HOME/{JOBS_DIR}" && ls -1t | tail -n +{int(keep) + 1} | while read -r j; do
    for g in "$j"/gen-*; do [ -e "$g/exit_code" ] || [ ! -e "$g/claimed" ] || continue 2; done
    rm -rf -- "$j"
  done ) >/dev/null 2>&1 || true"""


# The job's wrapper: its pid file when that names a process of this generation (it carries the mark), else
# the oldest process that does (a job cannot make itself unkillable, or another process killable, by
# rewriting its pid file). Empty when none is alive.
JOB_PID = """\
job_pid() {
  p=$(small "$1/pid" || true)
  case "$p" in ''|*[!0-9]*) ;; *) grep -qzxF -- "$2" "/proc/$p/environ" 2>/dev/null && { echo "$p"; return; };; esac
  oldest $(marked "$2")
}"""


def poll_command(job_id: str, generation: int, offset: int, max_bytes: int) -> str:
    """Print `<exit_code|-> <alive 0|1> <log size> <pid|->` on one line, then log bytes [offset, offset+max_bytes).

    `max_bytes=0` asks for the state only.

    Liveness is read before the exit code: the wrapper writes the exit code before it exits, so a job seen
    dead with no exit code was really lost (node restarted, wrapper killed). Alive means a process with the
    generation's mark lives.
    """
    if offset < 0 or max_bytes < 0:
        raise ValueError("offset and max_bytes must be >= 0")
    d = generation_dir(job_id, generation)
    return f"""\
{READ_SMALL}
{MARKED}
{JOB_PID}
d={d}
{TOUCH_ACTIVITY}
if [ ! -d "$d" ]; then echo "missing 0 0 -"; exit 0; fi
pid=$(job_pid "$d" {shlex.quote(job_mark(job_id, generation))})
alive=0; [ -z "$pid" ] || alive=1
ec=$(small "$d/exit_code" || true)
case "$ec" in ''|*[!0-9-]*) ec=-;; esac
size=0
if regular "$d/log"; then size=$(stat -c %s "$d/log" 2>/dev/null || echo 0); fi
echo "$ec $alive $size ${{pid:--}}"
""" + (
        f'if regular "$d/log"; then timeout {READ_TIMEOUT_S} tail -c +{int(offset) + 1} "$d/log" 2>/dev/null '
        f"| head -c {int(max_bytes)} || true; fi\n"
        if max_bytes
        else ""
    )


def kill_command(
    job_id: str, generation: int, sig: signal.Signals, grace_s: float, record_exit_code: int
) -> str:
    """Signal every process of the job's generation (by its mark, and the process groups they lead), SIGKILL
    what is left after `grace_s`, and record an exit code if none was written. Never a pid from a file."""
    d = generation_dir(job_id, generation)
    return f"""\
{READ_SMALL}
{MARKED}
{SIGNAL_MARKED}
d={d}
[ -d "$d" ] || {{ echo none; exit 0; }}
{end_marked_command(job_mark(job_id, generation), int(sig), grace_s)}
ec=$(small "$d/exit_code" || true)
case "$ec" in ''|*[!0-9-]*) ec={int(record_exit_code)}; rm -rf -- "$d/exit_code"; echo "$ec" > "$d/exit_code.tmp" && mv -T -- "$d/exit_code.tmp" "$d/exit_code";; esac
echo "killed $ec"
"""
