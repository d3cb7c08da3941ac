"""Finding and ending a node's processes by what they carry, never by a pid file a job could rewrite.

The job runs as the node's user: its pid files, its job dir and ~/.airflow_sky are all its to write. A
process the framework starts carries an environment entry instead (a job's generation JOB_MARK_ENV, a
bucket mount's MOUNT_MARK_ENV), set before the process exists: a process has it only if it was started
with it or descends from one that was, so a job can mark its own processes but never a bystander
(the node's server, sshd, another user's or another job's processes). `/proc/<pid>/environ` is readable
only for the user's own processes. Shell text from pure functions; every value through shlex.quote.
"""

from __future__ import annotations

import shlex

JOB_MARK_ENV = "AIRFLOW_SKY_JOB_MARK"  # <job id>/gen-<g>: every process of one generation of a job
MOUNT_MARK_ENV = "AIRFLOW_SKY_MOUNT"  # m-<key>: the rclone serving one bucket mount (node.rclone)

# own_environs: the environ files of this node's processes: those whose HOME is this one's. A local node's
#   processes share the host's /proc with other nodes' (as root, or without PID namespaces), and job ids and
#   marks repeat across clusters: a node's scripts must never see, signal or believe another node's.
#   Use it as `$(own_environs) /dev/null` (/dev/null: grep never falls back to reading stdin).
OWN_ENVIRONS = r"""own_environs() { grep -lzxF -- "HOME=$HOME" /proc/[0-9]*/environ 2>/dev/null; }"""
# marked ENTRY: the pids of this node whose environment holds exactly ENTRY (`KEY=value`); zombies hold none.
# stat_field PID N: field N of /proc/PID/stat (3 = state, 4 = ppid, 5 = pgrp, 22 = start time), read after
#   the command name, which may hold spaces and parentheses.
# oldest PID...: the one that started first (a job's wrapper among its processes).
MARKED = (
    OWN_ENVIRONS
    + r"""
marked() { grep -lzxF -- "$1" $(own_environs) /dev/null 2>/dev/null | cut -d/ -f3; }
stat_field() {
  local n=$2 s
  read -r s 2>/dev/null < "/proc/$1/stat" || return 1
  set -- ${s##*) }; shift $(( n - 3 )); echo "$1"
}
oldest() {
  local p t best= bt=
  for p in "$@"; do
    t=$(stat_field "$p" 22) || continue
    if [ -z "$bt" ] || [ "$t" -lt "$bt" ]; then best=$p; bt=$t; fi
  done
  echo "$best"
}"""
)

# signal_marked SIG ENTRY: signal every process holding ENTRY, and the process group of each that leads
# one (a job's wrapper leads its group: children that dropped the entry with `env -i` are still in it).
# Prints how many it found.
SIGNAL_MARKED = """signal_marked() {
  local n=0 p
  for p in $(marked "$2"); do
    kill "-$1" -- "$p" 2>/dev/null || true
    [ "$(stat_field "$p" 5)" = "$p" ] && kill "-$1" -- "-$p" 2>/dev/null
    n=$((n+1))
  done
  echo "$n"
}"""


def end_marked_command(entry: str, first_signal: int, grace_s: float) -> str:
    """Shell text: signal the processes holding `entry` (and the groups they lead) with `first_signal`,
    wait up to `grace_s` for them to go, then SIGKILL until none is left (a forking job is chased a
    bounded number of rounds). Sets `found` to how many there were at first."""
    ticks = max(1, int(grace_s * 10))
    e = shlex.quote(entry)
    return f"""\
found=$(signal_marked {int(first_signal)} {e})
i=0
while [ -n "$(marked {e})" ] && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done
i=0
while [ "$(signal_marked 9 {e})" -gt 0 ] && [ $i -lt 50 ]; do sleep 0.05; i=$((i+1)); done"""


def sweep_user_command(grace_s: float = 3.0, spare_sessions: bool = True) -> str:
    """Shell text for a host the cluster holds alone: end every process of the login user that is not
    serving an SSH session (this sweep's own, the worker's other commands), and every process of a job
    wherever it runs. Jobs that called `setsid`, forked twice or cleared their environment are found this
    way too: the user's processes outside SSH sessions are what the cluster's jobs and mounts left.
    Everything is stopped first (a forking job cannot outrun the sweep), then TERM, then KILL after
    `grace_s`. Only bash builtins read /proc: the sweep forks nothing it could mistake for a job.
    Prints `swept <n>`.

    An SSH session is a process under an `sshd` process owned by root (a job cannot start one of those,
    nor rename one of its own into it). Other users' processes are never signalled; as root (a pool whose
    login user is root) only the processes that carry a job's mark are. A job that gets itself an SSH
    session of its own (it can write ~/.ssh/authorized_keys) is spared: a job running as the login user
    owns that account.

    `spare_sessions=False` (an ssh pool host changing hands, infra/ssh/login_baseline.py) spares only the
    sweep's own connection (its ancestors, and the other channels of its SSH session: their processes are
    children of the session's process, as the SFTP server of the same connection): every other SSH session
    of the user ends too (a job's own login, the sessions of the cluster being let go), and so do children
    of the sweep's shell it did not start (what a login file sourced before the sweep started).
    """
    ticks = max(1, int(grace_s * 10))
    own_children = '[ "$ppid" != "$$" ]' if spare_sessions else '[ "$ppid" != "$PPID" ]'
    session_check = '! under_ssh "$p" || continue' if spare_sessions else ":"
    return f"""\
uid_of() {{
  local k a _
  owner=
  while read -r k a _; do [ "$k" = Uid: ] && {{ owner=$a; return 0; }}; done 2>/dev/null < "/proc/$1/status"
  return 1
}}
parent_of() {{
  local s
  read -r s 2>/dev/null < "/proc/$1/stat" || return 1
  comm=${{s#*(}}; comm=${{comm%)*}}
  set -- ${{s##*) }}; state=$1; ppid=$2
}}
job_entry() {{
  local e
  while IFS= read -r -d '' e; do case $e in {JOB_MARK_ENV}=*) return 0;; esac; done 2>/dev/null < "/proc/$1/environ"
  return 1
}}
under_ssh() {{
  local q=$1 i=0
  while [ "$q" -gt 1 ] && [ $i -lt 64 ] && parent_of "$q"; do
    case $comm in sshd*) uid_of "$q" && [ "$owner" = 0 ] && return 0;; esac
    q=$ppid; i=$((i+1))
  done
  return 1
}}
keep=" $$ "
q=$$
while [ "$q" -gt 1 ] && parent_of "$q"; do q=$ppid; keep="$keep$q "; done
sweep_pass() {{
  local sig=$1 d p
  n=0
  for d in /proc/[0-9]*; do
    p=${{d#/proc/}}
    case $keep in *" $p "*) continue;; esac
    uid_of "$p" && [ "$owner" = "$UID" ] || continue
    parent_of "$p" || continue
    [ "$state" != Z ] && {own_children} || continue
    if ! job_entry "$p"; then
      [ "$UID" != 0 ] || continue
      {session_check}
    fi
    [ "$sig" = none ] || kill "-$sig" "$p" 2>/dev/null || true
    n=$((n+1))
  done
}}
sweep_pass STOP; sweep_pass TERM; swept=$n; sweep_pass CONT
i=0
while sweep_pass none && [ $n -gt 0 ] && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done
i=0
while sweep_pass KILL && [ $n -gt 0 ] && [ $i -lt 50 ]; do sleep 0.05; i=$((i+1)); done
echo "swept $swept"
"""
