"""Autostop on the node itself: a dead-man switch that needs nothing but the node to work.

A small watcher runs detached on every node of a cluster with autostop. Every `check_s` it asks: is a job
running here (a live process group of an unfinished job generation)? Then the node is busy, and the idle
clock starts again. Otherwise, when nothing has touched `~/.airflow_sky/activity` for the idle limit, it
runs the infra's stop action (on EC2 `shutdown`, which stops or terminates the instance; on a local node a
request to its server) and exits. Airflow touches the file with every command it sends to the node (job
starts and the followers' polls), so a scheduler that died, or a DAG run nobody resumes, never keeps paid
nodes up past the limit: the node needs no credentials and no Airflow to stop itself.

The limit is never shorter than two of the watcher's rounds (2 minutes by default), so the gaps between
a DAG run's tasks (provision, then sync, then the setup start...) never stop a node under a running DAG,
even with `-i 0`.

`wait_for` as in SkyPilot: `jobs_and_ssh` (jobs and Airflow's commands keep the node up), `jobs` (only jobs
do), `none` (the limit counts from the arming, whatever runs).

Trust line: jobs can write ~/.airflow_sky/autostop. The watcher's code and its stop action live in its own
command line (`bash -c`), never in a file it runs; it is found by the mark in its environment
(AUTOSTOP_MARK_ENV=<hash of its code>), never by a pid file; a job is running while a process with that
generation's job mark lives. The settings files are data: numbers read bounded, words from a fixed set.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import shlex

from airflow_sky.node.paths import JOBS_DIR
from airflow_sky.node.processes import JOB_MARK_ENV, OWN_ENVIRONS
from airflow_sky.node.shell_reads import READ_SMALL

AUTOSTOP_DIR = ".airflow_sky/autostop"
ACTIVITY_PATH = ".airflow_sky/activity"
# In the commands Airflow sends: each one is a sign of life from the orchestrator. One fork per command:
# ~/.airflow_sky exists wherever a job was started (a poll without it has no job to poll).
TOUCH_ACTIVITY = f'touch "$HOME/{ACTIVITY_PATH}" 2>/dev/null || true'


@dataclasses.dataclass(frozen=True)
class NodeAutostop:
    """What the watcher needs: the idle limit, the command that stops this node, how often to look."""

    idle_s: int
    action: str
    wait_for: str = "jobs_and_ssh"
    check_s: float = 60.0


def floor_s(check_s: float) -> int:
    """The shortest idle limit a watcher applies: two of its rounds (see above)."""
    return math.ceil(2 * check_s)


def limit_s(idle_s: int, check_s: float) -> int:
    """The idle limit a watcher looking every `check_s` applies when asked for `idle_s`."""
    return max(int(idle_s), floor_s(check_s))


AUTOSTOP_MARK_ENV = "AIRFLOW_SKY_AUTOSTOP"


def watch_script(action: str) -> str:
    """The watcher loop, `action` inline; it reads its settings anew each round, so re-arming with the same
    action needs no restart."""
    return f"""\
{READ_SMALL}
{OWN_ENVIRONS}
dir="$HOME/{AUTOSTOP_DIR}"
activity="$HOME/{ACTIVITY_PATH}"
while :; do
  check_s=$(small "$dir/check_s" || echo 60); case "$check_s" in ''|*[!0-9.]*) check_s=60;; esac
  sleep "$check_s"
  [ -s "$dir/idle_s" ] || exit 0  # disarmed
  idle_s=$(small "$dir/idle_s" || echo 0); floor=$(small "$dir/floor_s" || echo 120)
  case "$idle_s" in ''|*[!0-9]*) idle_s=0;; esac
  case "$floor" in ''|*[!0-9]*) floor=120;; esac
  [ "$idle_s" -ge "$floor" ] || idle_s=$floor
  wait_for=$(small "$dir/wait_for" || echo jobs_and_ssh)
  case "$wait_for" in jobs|none) ;; *) wait_for=jobs_and_ssh;; esac
  busy=0
  if [ "$wait_for" != none ]; then
    # A job generation without an exit code whose marked processes live (a pid file proves nothing).
    for mark in $(grep -hzo -- '^{JOB_MARK_ENV}=[A-Za-z0-9._-]*/gen-[0-9]*' $(own_environs) /dev/null 2>/dev/null | tr '\\0' '\\n' | sort -u); do
      g="$HOME/{JOBS_DIR}/${{mark#*=}}"
      if [ ! -e "$g/exit_code" ]; then busy=1; break; fi
    done
  fi
  if [ $busy = 1 ]; then touch "$dir/since"; [ "$wait_for" = jobs ] || touch "$activity"; continue; fi
  last=$(stat -c %Y "$dir/since" 2>/dev/null || echo 0)
  if [ "$wait_for" = jobs_and_ssh ]; then
    seen=$(stat -c %Y "$activity" 2>/dev/null || echo 0); [ "$seen" -gt "$last" ] && last=$seen
  fi
  now=$(date +%s)
  if [ $((now - last)) -ge "$idle_s" ]; then
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) idle for $((now - last)) s (limit $idle_s s): stopping" >> "$dir/log"
    exec bash -c {shlex.quote(action)} >> "$dir/log" 2>&1
  fi
done
"""


def _mark(action: str) -> str:
    return f"{AUTOSTOP_MARK_ENV}=" + hashlib.sha256(watch_script(action).encode()).hexdigest()[:16]


# The pids of this user's watchers (any version), and whether one with exactly the mark $1 runs.
_WATCHERS = f"""\
{OWN_ENVIRONS}
watchers() {{ grep -lz -- '^{AUTOSTOP_MARK_ENV}=' $(own_environs) /dev/null 2>/dev/null | cut -d/ -f3; }}
watching() {{ grep -lzxF -- "$1" $(own_environs) /dev/null 2>/dev/null | grep -q .; }}"""


def arm_command(autostop: NodeAutostop) -> str:
    """Write the settings and start the watcher unless one with this action runs; idempotent. Prints nothing."""
    mark = _mark(autostop.action)
    return f"""\
dir="$HOME/{AUTOSTOP_DIR}"
mkdir -p "$dir" && chmod 700 "$dir"
rm -f "$dir/action" "$dir/watch.sh" "$dir/watcher.pid"  # what older versions ran: never run again
echo {int(autostop.idle_s)} > "$dir/idle_s"
echo {shlex.quote(autostop.wait_for)} > "$dir/wait_for"
echo {float(autostop.check_s):g} > "$dir/check_s"
echo {floor_s(autostop.check_s)} > "$dir/floor_s"
touch "$dir/since" "$HOME/{ACTIVITY_PATH}"
{_WATCHERS}
if ! watching {shlex.quote(mark)}; then
  old=$(watchers); [ -z "$old" ] || kill $old 2>/dev/null || true
  export {shlex.quote(mark)}
  setsid nohup bash -c {shlex.quote(watch_script(autostop.action))} < /dev/null > /dev/null 2>&1 &
  i=0; while ! watching {shlex.quote(mark)} && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
fi
"""


def disarm_command() -> str:
    """Turn autostop off (`autostop: false`): the watcher sees no limit and exits at its next round."""
    return f'rm -f "$HOME/{AUTOSTOP_DIR}/idle_s"'


def status_command() -> str:
    """`<idle_s|-> <watcher alive 0|1>`: what the node is armed with."""
    return f"""\
{READ_SMALL}
{_WATCHERS}
dir="$HOME/{AUTOSTOP_DIR}"
alive=0; [ -z "$(watchers)" ] || alive=1
echo "$(small "$dir/idle_s" || echo -) $alive"
"""
