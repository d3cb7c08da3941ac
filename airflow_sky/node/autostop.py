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
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from airflow_sky.node.paths import JOBS_DIR
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


def watch_script() -> str:
    """The watcher loop (watch.sh); it reads its settings anew each round, so re-arming needs no restart."""
    return f"""\
{READ_SMALL}
dir="$HOME/{AUTOSTOP_DIR}"
activity="$HOME/{ACTIVITY_PATH}"
echo $$ > "$dir/watcher.pid"
while :; do
  sleep "$(small "$dir/check_s" || echo 60)"
  [ -s "$dir/idle_s" ] || {{ rm -f "$dir/watcher.pid"; exit 0; }}  # disarmed
  idle_s=$(small "$dir/idle_s" || echo 0); floor=$(small "$dir/floor_s" || echo 120)
  [ "$idle_s" -ge "$floor" ] || idle_s=$floor
  wait_for=$(small "$dir/wait_for" || echo jobs_and_ssh)
  busy=0
  if [ "$wait_for" != none ]; then
    for p in "$HOME"/{JOBS_DIR}/*/gen-*/pid; do
      [ -e "$p" ] && [ ! -e "${{p%/pid}}/exit_code" ] || continue
      pid=$(small "$p" || true)
      case "$pid" in ''|*[!0-9]*|0|1) continue;; esac
      if kill -0 -- "-$pid" 2>/dev/null; then busy=1; break; fi
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
    rm -f "$dir/watcher.pid"
    exec bash "$dir/action" >> "$dir/log" 2>&1
  fi
done
"""


def arm_command(autostop: NodeAutostop) -> str:
    """Write the settings and start the watcher unless one runs; idempotent. Prints nothing."""
    return f"""\
dir="$HOME/{AUTOSTOP_DIR}"
mkdir -p "$dir" && chmod 700 "$dir"
printf '%s\\n' {shlex.quote(autostop.action)} > "$dir/action.tmp" && mv "$dir/action.tmp" "$dir/action"
echo {int(autostop.idle_s)} > "$dir/idle_s"
echo {shlex.quote(autostop.wait_for)} > "$dir/wait_for"
echo {float(autostop.check_s):g} > "$dir/check_s"
echo {floor_s(autostop.check_s)} > "$dir/floor_s"
touch "$dir/since" "$HOME/{ACTIVITY_PATH}"
cat > "$dir/watch.sh" <<'AIRFLOW_SKY_WATCH'
{watch_script()}AIRFLOW_SKY_WATCH
{READ_SMALL}
pid=$(small "$dir/watcher.pid" || true)
case "$pid" in ''|*[!0-9]*) running=0;; *) kill -0 "$pid" 2>/dev/null && running=1 || running=0;; esac
if [ $running = 0 ]; then
  setsid nohup bash "$dir/watch.sh" < /dev/null > /dev/null 2>&1 &
  i=0; while [ ! -s "$dir/watcher.pid" ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
fi
"""


def disarm_command() -> str:
    """Turn autostop off (`autostop: false`): the watcher sees no limit and exits at its next round."""
    return f'rm -f "$HOME/{AUTOSTOP_DIR}/idle_s"'


def status_command() -> str:
    """`<idle_s|-> <watcher alive 0|1>`: what the node is armed with."""
    return f"""\
{READ_SMALL}
dir="$HOME/{AUTOSTOP_DIR}"
pid=$(small "$dir/watcher.pid" || true)
alive=0; case "$pid" in ''|*[!0-9]*) ;; *) kill -0 "$pid" 2>/dev/null && alive=1;; esac
echo "$(small "$dir/idle_s" || echo -) $alive"
"""
