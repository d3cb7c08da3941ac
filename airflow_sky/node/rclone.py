"""Shell text that fetches and mounts buckets on a node with rclone, built by pure functions.

rclone does all three modes with one tool and one config for s3 (and S3-compatible endpoints) and gcs:
`rclone copy` for COPY (parallel transfers, listing in one request), `rclone mount` for MOUNT (a VFS cache of
the files being written, uploaded on close) and MOUNT_CACHED (reads cached too, uploads written back in the
background). Each mount runs its own remote-control server on the node's loopback; its `vfs/stats` says how
many uploads are still pending, which is what a job's verdict waits for (`flush_function`).

The node keeps its mounts under ~/.airflow_sky/mounts:
    rclone.conf           the task's bucket remotes, 0600; removed at teardown (detach_script)
    m-<key>/              one mount: dest, source, uri (what it serves, for the log), log, cache/
    creds/                the credentials of mounts that take theirs from the node's credential server
                          (node.credential_server: an STS session or a token that the worker replaces
                          while the mount runs); removed at teardown with the server

Trust line: a job runs as the node's user and can rewrite all of that. Nothing here runs a file from
there, and no pid or port is read from there: each mount's rclone carries MOUNT_MARK_ENV=m-<key> in its
environment (node.processes), and is found, signalled and asked for its rc port (its own command line) by
that. The flush runs inline in each job's launch.sh, for that job's own mounts (node.shell.launch_script).
Mounts are shared by the node's jobs: an attach never unmounts another destination, and replaces a
destination's mount from another source only while no job runs on the node; teardown detaches all.
"""

from __future__ import annotations

import configparser
import dataclasses
import hashlib
import io
import shlex
from collections.abc import Collection, Mapping, Sequence

from airflow_sky.node.credential_server import CREDS, CREDS_DIR, SERVER_ENTRY, SERVER_FUNCTIONS
from airflow_sky.node.paths import MOUNTS_DIR
from airflow_sky.node.processes import JOB_MARK_ENV, MARKED, MOUNT_MARK_ENV
from airflow_sky.task.storage import COPY, BucketMount

MOUNTS = f'"$HOME"/{MOUNTS_DIR}'
CONFIG = f"{MOUNTS}/rclone.conf"
OLD_FLUSH = f"{MOUNTS}/flush"  # where older versions kept a flush script: removed, never run
MOUNT_READY_S = 30  # a mount that is not up by then failed (its log says why)
DEFAULT_FLUSH_TIMEOUT_S = 3600  # the longest a job's verdict waits for a mount's pending uploads
COPY_TRANSFERS = 16  # parallel object transfers of one COPY per node
_VFS_FLAGS = {
    # MOUNT: a written file is uploaded as soon as it is closed (SkyPilot: "written on close()").
    "MOUNT": ("--vfs-cache-mode", "writes", "--vfs-write-back", "0s"),
    # MOUNT_CACHED: reads cached on the node's disk too; writes go up in the background, in write order.
    "MOUNT_CACHED": ("--vfs-cache-mode", "full", "--vfs-write-back", "1s"),
}


def remote_name(store: str) -> str:
    return f"sky-{store}"


def config_text(remotes: Mapping[str, Mapping[str, str]]) -> str:
    """rclone.conf text: one section per remote (`sky-s3`, `sky-gcs`) with its options."""
    parser = configparser.ConfigParser(interpolation=None)
    for name, options in remotes.items():
        parser[name] = dict(options)
    buffer = io.StringIO()
    parser.write(buffer)
    return buffer.getvalue()


def mount_key(destination: str) -> str:
    """A mount's directory name: stable per destination, whatever characters the path has."""
    return "m-" + hashlib.sha256(destination.encode()).hexdigest()[:12]


def node_path(destination: str) -> str:
    """A file_mounts destination as a shell word: `~/x` under $HOME, an absolute path as is (quoted)."""
    if destination == "~":
        return '"$HOME"'
    if destination.startswith("~/"):
        return f'"$HOME"/{shlex.quote(destination[2:])}'
    return shlex.quote(destination)


@dataclasses.dataclass(frozen=True)
class FlushedMount:
    """A mount whose pending uploads a job's verdict waits for: its key, and its names for the log."""

    key: str
    destination: str
    uri: str

    @classmethod
    def of(cls, mount: BucketMount) -> FlushedMount:
        return cls(mount_key(mount.destination), mount.destination, mount.uri)

    def words(self) -> tuple[str, str, str]:
        return (self.key, self.destination, self.uri)


def flushed_mounts(mounts: Sequence[BucketMount]) -> tuple[FlushedMount, ...]:
    """The mounts (MOUNT, MOUNT_CACHED) among a job's bucket file_mounts: what its verdict waits for."""
    return tuple(FlushedMount.of(m) for m in mounts if m.mode != COPY)


def source_of(mount: BucketMount) -> str:
    """The rclone path of a mount's bucket (and folder)."""
    return f"{remote_name(mount.store)}:{mount.bucket}" + (f"/{mount.prefix}" if mount.prefix else "")


def attach_script(
    mounts: Sequence[BucketMount], rank: int, plain_http: bool = False, served: Collection[str] = ()
) -> str:
    """Install the config (a tar on stdin), then copy or mount every bucket; idempotent.

    Run it with bash (it uses $RANDOM and `jobs`). Prints one `copied <dest> <files> <bytes>` or `mounted <dest> <pid>` line per mount. A mount
    already serving the same source at its destination is kept (a retried sync, or another job's); one
    serving another source is replaced only while no job runs on the node (else a clear error). Other
    destinations' mounts are left alone: they may serve a running job. A flush script an older version
    left is removed. `plain_http`: an endpoint without TLS, which rclone refuses while AWS_CA_BUNDLE is set.
    `served`: the stores whose credential the mounts and copies fetch from the node's credential server
    (the tar holds creds/<key>/... for their mounts: node.credential_server), started when none runs.
    """
    lines = [
        "set -eu",
        _CHECK_TOOLS,
        # Only the framework's own files are private: what lands in a mount keeps the user's usual modes.
        f"(umask 077 && mkdir -p {MOUNTS})",
        f"staged=$(umask 077 && mktemp -d {MOUNTS}/.attach-XXXXXX)",
        "trap 'rm -rf -- \"$staged\"' EXIT",
        f'tar -xf - -C "$staged" && mv -f "$staged/rclone.conf" {CONFIG} && chmod 600 {CONFIG}',
    ]
    if plain_http:
        lines.append("unset AWS_CA_BUNDLE")
    lines.append(f"{SERVER_FUNCTIONS}\n{_UNMOUNT}")
    if any(m.store in served for m in mounts):
        lines.append(f'sky_creds_server\nsky_put_creds "$staged/{CREDS_DIR}" >/dev/null')
    lines.append('rm -rf -- "$staged"')
    lines.append(_FUNCTIONS.replace("@RANK@", str(int(rank))))
    copies = [m for m in mounts if m.mode == COPY]
    lines.append(f"copying=\nrm -f -- {OLD_FLUSH}")
    for mount in mounts:
        if mount.mode != COPY:
            lines.append(_mount_call(mount, served))
    # COPYs run side by side: a node fetching several buckets waits for the slowest, not the sum.
    for mount in copies:
        words = (
            node_path(mount.destination),
            shlex.quote(source_of(mount)),
            shlex.quote(mount.destination),
            shlex.quote(mount.uri),
            shlex.quote(mount_key(mount.destination)),
            mount.store if mount.store in served else "-",
        )
        lines.append(f'sky_copy {" ".join(words)} & copying="$copying $!"')
    if copies:
        # Only the copies: a mount's rclone is a background job of this shell too, and runs on.
        lines.append('for job in $copying; do wait "$job" || exit 1; done')
    return "\n".join(lines) + "\n"


def _mount_call(mount: BucketMount, served: Collection[str]) -> str:
    words = [
        "sky_mount",
        node_path(mount.destination),
        shlex.quote(source_of(mount)),
        shlex.quote(mount_key(mount.destination)),
        shlex.quote(mount.destination),
        shlex.quote(mount.uri),
        mount.store if mount.store in served else "-",
        *map(shlex.quote, _VFS_FLAGS[mount.mode]),
    ]
    return " ".join(words)


_CHECK_TOOLS = """\
if ! command -v rclone >/dev/null 2>&1 || { ! command -v fusermount3 >/dev/null 2>&1 && ! command -v fusermount >/dev/null 2>&1; }; then
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq rclone fuse3; } >/dev/null 2>&1 || true
  fi
fi
command -v rclone >/dev/null 2>&1 || { echo "rclone is not installed and could not be installed (apt-get install rclone fuse3)" >&2; exit 3; }"""

# sky_copy DEST SOURCE SHOWN URI KEY CRED: rclone copyto (a folder or one object) with parallel transfers, then a
#   summary line; CRED: the store whose credential it fetches from the node's server as KEY's, or `-`.
# sky_mount DEST SOURCE KEY SHOWN URI CRED FLAGS...: an rclone mount with its own rc port, marked with its key,
#   waited for; CRED as for sky_copy (the mount keeps fetching KEY's credential while it runs).
# sky_unmount DEST: unmount DEST if it is an rclone FUSE mount (a rewritten state file unmounts nothing else).
# sky_mount_pids KEY / sky_src PID / sky_dest PID: the processes serving mount KEY; what one mounts where (its
# command line: `rclone mount SOURCE DEST ...`).
_FUNCTIONS = f"""\
sky_copy() {{
  if mountpoint -q "$1" 2>/dev/null; then sky_unmount "$1"; fi
  # copyto: a source that is one object (not a folder) lands at the destination itself, as SkyPilot copies a
  # file URI (`rclone copy` would put it in a directory of that name); a folder it copies exactly as `copy`.
  # No stat first: that was one more rclone start and request per node (0.3 s here).
  mkdir -p "$(dirname "$1")"
  if ! out=$( [ "$6" = - ] || sky_cred_env "$6" "$5"
      rclone copyto "$2" "$1" --config {CONFIG} --transfers {COPY_TRANSFERS} --checkers {COPY_TRANSFERS} --fast-list --log-level ERROR 2>&1); then
    rm -rf -- {CREDS}/"$5"
    echo "file_mounts.$3: copying $4 to $1 on rank @RANK@ failed: $(printf '%s' "$out" | tail -n 5)" >&2; return 1
  fi
  rm -rf -- {CREDS}/"$5"  # a copy is done with its credential
  [ -e "$1" ] || mkdir -p "$1"  # an empty folder copies nothing: the destination is an empty directory
  echo "copied $3 $(find "$1" -type f -printf '%s\\n' | awk '{{n++; s+=$1}} END {{print n+0, s+0}}')"
}}
sky_mount() {{
  dest=$1 src=$2 key=$3 m={MOUNTS}/$3 shown=$4 uri=$5 cred=$6; shift 6
  (umask 077 && mkdir -p "$m")
  pids=$(sky_mount_pids "$key")
  if mountpoint -q "$dest" 2>/dev/null; then
    for pid in $pids; do
      if [ "$(sky_src "$pid")" = "$src" ]; then echo "mounted $shown $pid"; return 0; fi
    done
    if [ -n "$(grep -lz '^{JOB_MARK_ENV}=' $(own_environs) /dev/null 2>/dev/null | head -n 1)" ]; then
      echo "file_mounts.$shown: $dest on rank @RANK@ is mounted from another bucket, and a job on this node may be using it; wait until the node's jobs end, or mount at another path" >&2; return 1
    fi
    sky_unmount "$dest"
  fi
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  mkdir -p "$dest"
  if [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "file_mounts.$shown: $dest on rank @RANK@ is a directory with files in it; a bucket mounts only on an empty or new directory" >&2; return 1
  fi
  printf '%s\\n' "$src" > "$m/source"; printf '%s\\n' "$shown" > "$m/dest"; printf '%s\\n' "$uri" > "$m/uri"
  for try in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 40000 ))
    : > "$m/log"
    ( [ "$cred" = - ] || sky_cred_env "$cred" "$key"
      exec env {MOUNT_MARK_ENV}="$key" setsid rclone mount "$src" "$dest" --config {CONFIG} "$@" --cache-dir "$m/cache" \\
        --dir-cache-time 5s --rc --rc-addr "127.0.0.1:$port" --log-file "$m/log" --log-level INFO ) </dev/null >/dev/null 2>&1 &
    pid=$!
    i=0
    while [ $i -lt {MOUNT_READY_S * 10} ]; do
      if mountpoint -q "$dest" 2>/dev/null; then
        echo "mounted $shown $pid"; return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1; i=$((i+1))
    done
    kill "$pid" 2>/dev/null || true
    grep -q "address already in use" "$m/log" 2>/dev/null || break
  done
  echo "mounting $uri on $dest (file_mounts.$shown) on rank @RANK@ failed: $(grep -v ' INFO ' "$m/log" 2>/dev/null | tail -n 5)" >&2
  return 1
}}"""


_UNMOUNT = f"""\
sky_mount_pids() {{ marked "{MOUNT_MARK_ENV}=$1"; }}
sky_src() {{ tr '\\0' '\\n' < "/proc/$1/cmdline" 2>/dev/null | sed -n '/^mount$/{{n;p;q;}}'; }}
sky_dest() {{ tr '\\0' '\\n' < "/proc/$1/cmdline" 2>/dev/null | sed -n '/^mount$/{{n;n;p;q;}}'; }}
sky_unmount() {{
  awk -v d="$1" '{{ gsub(/\\\\040/, " ", $5); gsub(/\\\\134/, "\\\\", $5) }}
    $5 == d {{ for (i = 7; i < NF; i++) if ($i == "-") {{ if ($(i + 1) == "fuse.rclone") f = 1; break }} }}
    END {{ exit !f }}' /proc/self/mountinfo 2>/dev/null || return 0
  fusermount3 -uz "$1" 2>/dev/null || fusermount -uz "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}}"""


def flush_function() -> str:
    """`sky_flush KEY SHOWN URI...`: wait until the named mounts have no upload pending; return 1 naming the
    mount when one cannot finish. The job's launch.sh holds it (node.shell.launch_script), with the job's
    own mounts as the worker knows them: nothing on the node's disk is run or believed for it.

    Each mount's rclone is found by its mark, its rc port read from its own command line. The deadline is
    AIRFLOW_SKY_FLUSH_TIMEOUT_S (default 3600 s). A mount whose rclone is gone (uploads pending or not: they
    cannot be known), or whose uploads keep failing past the deadline, fails the job: its writes may never
    have reached the bucket.
    """
    return f"""\
{MARKED}
{_UNMOUNT}
sky_flush() {{
  local deadline status=0 key shown src port pid stats pending n field announced
  deadline=$(( $(date +%s) + ${{AIRFLOW_SKY_FLUSH_TIMEOUT_S:-{DEFAULT_FLUSH_TIMEOUT_S}}} ))
  while [ $# -ge 3 ]; do
    key=$1 shown=$2 src=$3; shift 3
    port=
    for pid in $(sky_mount_pids "$key"); do
      port=$(tr '\\0' '\\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n '/^--rc-addr$/{{n;s/^127\\.0\\.0\\.1:\\([0-9][0-9]*\\)$/\\1/p;q;}}')
      [ -z "$port" ] || break
    done
    announced=0
    while :; do
      if [ -z "$port" ] || ! stats=$(timeout 60 rclone rc --url "http://127.0.0.1:$port/" vfs/stats 2>/dev/null | head -c 65536; exit "${{PIPESTATUS[0]}}"); then
        echo "airflow-sky: file_mounts.$shown ($src): the mount's rclone is gone; writes not yet uploaded are lost"
        status=1; break
      fi
      pending=0
      for field in uploadsInProgress uploadsQueued; do
        n=$(printf '%s\\n' "$stats" | sed -n "s/.*\\"$field\\": *\\([0-9]*\\).*/\\1/p" | head -n 1)
        pending=$(( pending + ${{n:-0}} ))
      done
      [ "$pending" -eq 0 ] && break
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "airflow-sky: file_mounts.$shown ($src): $pending upload(s) still pending at the deadline (AIRFLOW_SKY_FLUSH_TIMEOUT_S); see ~/{MOUNTS_DIR}/$key/log"
        status=1; break
      fi
      if [ $announced = 0 ]; then echo "airflow-sky: waiting for $pending upload(s) of file_mounts.$shown to reach $src"; announced=1; fi
      sleep 1
    done
  done
  return $status
}}"""


def detach_script(flush_timeout_s: int = 300) -> str:
    """Flush (bounded), unmount every bucket mount of the node, stop its rclone, remove the credentials.

    The mounts are found by their processes' marks and unmounted by the destinations on those processes'
    command lines; a destination read from a state file is unmounted only if it is an rclone FUSE mount
    (a stale one whose rclone died)."""
    return f"""\
set -u
{flush_function()}
m0={MOUNTS}
[ -d "$m0" ] || {{ echo "detached 0"; exit 0; }}
mounts=$(grep -Hzo -- '^{MOUNT_MARK_ENV}=m-[0-9a-f]*' $(own_environs) /dev/null 2>/dev/null | tr '\\0' '\\n' | sed -n 's|^/proc/\\([0-9]*\\)/environ:{MOUNT_MARK_ENV}=|\\1 |p')
set --
while read -r pid key; do
  [ -n "$key" ] && set -- "$@" "$key" "$(sky_dest "$pid")" "$(sky_src "$pid")"
done <<< "$mounts"
AIRFLOW_SKY_FLUSH_TIMEOUT_S={int(flush_timeout_s)} sky_flush "$@" || true
while read -r pid key; do
  [ -n "$key" ] || continue
  dest=$(sky_dest "$pid")
  [ -z "$dest" ] || sky_unmount "$dest"
  kill "$pid" 2>/dev/null || true
done <<< "$mounts"
n=0
for m in "$m0"/m-*; do
  [ -d "$m" ] || continue
  dest=$(head -c 4096 "$m/dest" 2>/dev/null | head -n 1 || true)
  case "$dest" in "~") dest=$HOME;; "~/"*) dest="$HOME/${{dest#\\~/}}";; esac
  [ -z "$dest" ] || sky_unmount "$dest"
  rm -rf -- "$m"; n=$((n+1))
done
for pid in $(marked {SERVER_ENTRY}); do kill "$pid" 2>/dev/null || true; done
rm -rf -- {CREDS}
rm -rf -- {MOUNTS}/.attach-* {MOUNTS}/.creds-*
rm -f {CONFIG} {OLD_FLUSH} {CREDS}.log
echo "detached $n"
"""
