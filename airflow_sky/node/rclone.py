"""Shell text that fetches and mounts buckets on a node with rclone, built by pure functions.

rclone does all three modes with one tool and one config for s3 (and S3-compatible endpoints) and gcs:
`rclone copy` for COPY (parallel transfers, listing in one request), `rclone mount` for MOUNT (a VFS cache of
the files being written, uploaded on close) and MOUNT_CACHED (reads cached too, uploads written back in the
background). Each mount runs its own remote-control server on the node's loopback; its `vfs/stats` says how
many uploads are still pending, which is what a job's verdict waits for (`flush_script`).

The node keeps its mounts under ~/.airflow_sky/mounts:
    rclone.conf           the task's bucket remotes, 0600; removed at teardown (detach_script)
    m-<key>/              one mount: dest, source, pid, rc (port), log, cache/
    flush                 waits until every mount's uploads are done (launch.sh runs it after a script)
"""

from __future__ import annotations

import configparser
import hashlib
import io
import shlex
from collections.abc import Mapping, Sequence

from airflow_sky.node.paths import MOUNTS_DIR
from airflow_sky.task.storage import COPY, BucketMount

MOUNTS = f'"$HOME"/{MOUNTS_DIR}'
CONFIG = f"{MOUNTS}/rclone.conf"
FLUSH = f"{MOUNTS}/flush"
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


def source_of(mount: BucketMount) -> str:
    """The rclone path of a mount's bucket (and folder)."""
    return f"{remote_name(mount.store)}:{mount.bucket}" + (f"/{mount.prefix}" if mount.prefix else "")


def attach_script(mounts: Sequence[BucketMount], rank: int, plain_http: bool = False) -> str:
    """Install the config (a tar on stdin), then copy or mount every bucket; idempotent.

    Run it with bash (it uses $RANDOM and `jobs`). Prints one `copied <dest> <files> <bytes>` or `mounted <dest> <pid>` line per mount. A mount
    already serving the same source at its destination is kept (a retried sync); another one is replaced.
    `plain_http`: an endpoint without TLS, which rclone refuses while AWS_CA_BUNDLE is set.
    """
    lines = [
        "set -eu",
        _CHECK_TOOLS,
        # Only the framework's own files are private: what lands in a mount keeps the user's usual modes.
        f"(umask 077 && mkdir -p {MOUNTS} && tar -xf - -C {MOUNTS} && chmod 600 {CONFIG})",
    ]
    if plain_http:
        lines.append("unset AWS_CA_BUNDLE")
    lines.append(_FUNCTIONS.replace("@RANK@", str(int(rank))))
    copies = [m for m in mounts if m.mode == COPY]
    lines.append("copying=")
    kept = [mount_key(m.destination) for m in mounts if m.mode != COPY]
    lines.append(" ".join(["sky_forget", *map(shlex.quote, kept)]))
    for mount in mounts:
        if mount.mode != COPY:
            lines.append(_mount_call(mount))
    # COPYs run side by side: a node fetching several buckets waits for the slowest, not the sum.
    for mount in copies:
        words = (
            node_path(mount.destination),
            shlex.quote(source_of(mount)),
            shlex.quote(mount.destination),
            shlex.quote(mount.uri),
        )
        lines.append(f'sky_copy {" ".join(words)} & copying="$copying $!"')
    if copies:
        # Only the copies: a mount's rclone is a background job of this shell too, and runs on.
        lines.append('for job in $copying; do wait "$job" || exit 1; done')
    lines.append(_write_flush())
    return "\n".join(lines) + "\n"


def _mount_call(mount: BucketMount) -> str:
    words = [
        "sky_mount",
        node_path(mount.destination),
        shlex.quote(source_of(mount)),
        shlex.quote(mount_key(mount.destination)),
        shlex.quote(mount.destination),
        shlex.quote(mount.uri),
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

# sky_forget KEY...: stop and forget the node's mounts that are not among KEY... (an earlier task's).
# sky_copy DEST SOURCE SHOWN URI: rclone copyto (a folder or one object) with parallel transfers, then a summary line.
# sky_mount DEST SOURCE KEY SHOWN URI FLAGS...: an rclone mount with its own rc port, waited for.
_FUNCTIONS = f"""\
sky_copy() {{
  if mountpoint -q "$1" 2>/dev/null; then sky_unmount "$1"; fi
  # copyto: a source that is one object (not a folder) lands at the destination itself, as SkyPilot copies a
  # file URI (`rclone copy` would put it in a directory of that name); a folder it copies exactly as `copy`.
  # No stat first: that was one more rclone start and request per node (0.3 s here).
  mkdir -p "$(dirname "$1")"
  if ! out=$(rclone copyto "$2" "$1" --config {CONFIG} --transfers {COPY_TRANSFERS} --checkers {COPY_TRANSFERS} --fast-list --log-level ERROR 2>&1); then
    echo "file_mounts.$3: copying $4 to $1 on rank @RANK@ failed: $(printf '%s' "$out" | tail -n 5)" >&2; return 1
  fi
  [ -e "$1" ] || mkdir -p "$1"  # an empty folder copies nothing: the destination is an empty directory
  echo "copied $3 $(find "$1" -type f -printf '%s\\n' | awk '{{n++; s+=$1}} END {{print n+0, s+0}}')"
}}
sky_unmount() {{
  fusermount3 -uz "$1" 2>/dev/null || fusermount -uz "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}}
sky_forget() {{
  for m in {MOUNTS}/m-*; do
    [ -d "$m" ] || continue
    case " $* " in *" ${{m##*/}} "*) continue;; esac
    dest=$(cat "$m/dest" 2>/dev/null || true)
    case "$dest" in "~") dest=$HOME;; "~/"*) dest="$HOME/${{dest#\\~/}}";; esac
    [ -z "$dest" ] || sky_unmount "$dest"
    pid=$(cat "$m/pid" 2>/dev/null || true); [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    rm -rf -- "$m"
  done
}}
sky_mount() {{
  dest=$1 src=$2 m={MOUNTS}/$3 shown=$4 uri=$5; shift 5
  (umask 077 && mkdir -p "$m")
  if mountpoint -q "$dest" 2>/dev/null; then
    pid=$(cat "$m/pid" 2>/dev/null || true)
    if [ "$(cat "$m/source" 2>/dev/null)" = "$src" ] && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "mounted $shown $pid"; return 0
    fi
    sky_unmount "$dest"
  fi
  pid=$(cat "$m/pid" 2>/dev/null || true); [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  mkdir -p "$dest"
  if [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "file_mounts.$shown: $dest on rank @RANK@ is a directory with files in it; a bucket mounts only on an empty or new directory" >&2; return 1
  fi
  printf '%s\\n' "$src" > "$m/source"; printf '%s\\n' "$shown" > "$m/dest"; printf '%s\\n' "$uri" > "$m/uri"
  for try in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 40000 ))
    : > "$m/log"
    setsid rclone mount "$src" "$dest" --config {CONFIG} "$@" --cache-dir "$m/cache" --dir-cache-time 5s \\
      --rc --rc-addr "127.0.0.1:$port" --log-file "$m/log" --log-level INFO </dev/null >/dev/null 2>&1 &
    pid=$!
    i=0
    while [ $i -lt {MOUNT_READY_S * 10} ]; do
      if mountpoint -q "$dest" 2>/dev/null; then
        echo "$pid" > "$m/pid"; echo "$port" > "$m/rc"; echo "mounted $shown $pid"; return 0
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


def _write_flush() -> str:
    """Write ~/.airflow_sky/mounts/flush: the script launch.sh runs after a job's script (flush_script)."""
    return f"cat > {FLUSH} <<'AIRFLOW_SKY_FLUSH'\n{flush_script()}AIRFLOW_SKY_FLUSH\nchmod 700 {FLUSH}"


def flush_script() -> str:
    """Wait until no mount of the node has uploads pending; exit 1 naming the mount when one cannot finish.

    The deadline is AIRFLOW_SKY_FLUSH_TIMEOUT_S (default 3600 s). A mount whose rclone died with uploads
    pending, or whose uploads keep failing past the deadline, fails the job: its writes never reached
    the bucket.
    """
    return f"""\
#!/bin/bash
deadline=$(( $(date +%s) + ${{AIRFLOW_SKY_FLUSH_TIMEOUT_S:-{DEFAULT_FLUSH_TIMEOUT_S}}} ))
status=0
for m in {MOUNTS}/m-*; do
  [ -s "$m/rc" ] || continue
  port=$(cat "$m/rc"); shown=$(cat "$m/dest"); src=$(cat "$m/uri")
  announced=0
  while :; do
    if ! stats=$(rclone rc --url "http://127.0.0.1:$port/" vfs/stats 2>/dev/null); then
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
      echo "airflow-sky: file_mounts.$shown ($src): $pending upload(s) still pending at the deadline (AIRFLOW_SKY_FLUSH_TIMEOUT_S); see $m/log"
      status=1; break
    fi
    if [ $announced = 0 ]; then echo "airflow-sky: waiting for $pending upload(s) of file_mounts.$shown to reach $src"; announced=1; fi
    sleep 1
  done
done
exit $status
"""


def detach_script(flush_timeout_s: int = 300) -> str:
    """Flush (bounded), unmount every bucket mount of the node, stop its rclone, remove the credentials."""
    return f"""\
set -u
m0={MOUNTS}
[ -d "$m0" ] || {{ echo "detached 0"; exit 0; }}
if [ -x {FLUSH} ]; then AIRFLOW_SKY_FLUSH_TIMEOUT_S={int(flush_timeout_s)} {FLUSH} || true; fi
n=0
for m in "$m0"/m-*; do
  [ -d "$m" ] || continue
  dest=$(cat "$m/dest" 2>/dev/null || true)
  case "$dest" in "~") dest=$HOME;; "~/"*) dest="$HOME/${{dest#\\~/}}";; esac
  if [ -n "$dest" ]; then fusermount3 -uz "$dest" 2>/dev/null || fusermount -uz "$dest" 2>/dev/null || umount -l "$dest" 2>/dev/null || true; fi
  pid=$(cat "$m/pid" 2>/dev/null || true)
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  rm -rf -- "$m"; n=$((n+1))
done
rm -f {CONFIG} {FLUSH}
echo "detached $n"
"""
