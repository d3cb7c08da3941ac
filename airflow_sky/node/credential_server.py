"""The node's credential server: bucket mounts fetch their credential from it, so the worker can replace
the credential while they run (a job outlives an STS session or a downscoped token).

A node's rclone never reads a refreshable credential from rclone.conf (it would keep it until it exits).
Each mount (and each COPY, while it runs) takes it from a file of its own, served on the node's loopback by
one `rclone serve http` per node:

    ~/.airflow_sky/mounts/creds/                       0700, what the server serves
        ready                                          a nonce: proves a port is this server's
        <key>/s3.json                                  the ECS container credentials JSON of mount <key>
        <key>/computeMetadata/v1/instance/service-accounts/default/token    a gcs mount's access token

- s3: the AWS SDK's container credentials provider (`env_auth`, AWS_CONTAINER_CREDENTIALS_FULL_URI,
  AWS_CONTAINER_AUTHORIZATION_TOKEN) fetches the file again 5 minutes before its Expiration, and signs
  every later request with what it got.
- gcs: Google's metadata token source (rclone 1.60's gcs without a token or key falls back to application
  default credentials; GCE_METADATA_HOST points them at this server): the file says `expires_in` is at
  most GCS_REREAD_S, so rclone fetches it again that often.

The server asks for basic auth (user `sky`, a password made on the node from /dev/urandom); the password
is in the environment of the server and of the mounts (AIRFLOW_SKY_CREDS=<port>:<password>, where a
restarted server finds it again), never on a command line: /proc/<pid>/environ is readable only by the
node's user. So other users of the host (an ssh pool host, local nodes sharing the loopback) can neither
read the files nor the password; the node's user (every job on the node) can, as it can read rclone.conf.

Shell text from pure functions; the credential files reach the node as a tar on the SSH channel's stdin.
"""

from __future__ import annotations

import datetime
import io
import json
import tarfile
import time
from collections.abc import Mapping

from airflow_sky.node.paths import MOUNTS_DIR
from airflow_sky.node.processes import MARKED, MOUNT_MARK_ENV

CREDS = f'"$HOME"/{MOUNTS_DIR}/creds'
CREDS_DIR = "creds"  # in the tar, relative to the mounts dir
SERVER_ENTRY = f"{MOUNT_MARK_ENV}=creds"  # the server's mark (node.processes): found and ended by it
CREDS_ENV = "AIRFLOW_SKY_CREDS"  # <port>:<password> of the node's server, in its and the mounts' environment
S3_FILE = "s3.json"
GCS_FILE = "computeMetadata/v1/instance/service-accounts/default/token"
GCS_REREAD_S = 300  # a gcs mount reads its token again at least this often
SERVED_STORES = ("s3", "gcs")
REFRESH_TIMEOUT_S = 60


def served_file(store: str, options: Mapping[str, str], expires: datetime.datetime) -> tuple[str, str]:
    """The file name (below a mount's key) and text the node serves for a `store` credential (its rclone
    options, as node.credentials mints them)."""
    if store == "s3":
        expiry = expires.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        document = {
            "AccessKeyId": options["access_key_id"],
            "SecretAccessKey": options["secret_access_key"],
            "Token": options.get("session_token", ""),
            "Expiration": expiry,
        }
        return S3_FILE, json.dumps(document)
    token = json.loads(options["token"])["access_token"]
    left = int((expires - datetime.datetime.now(datetime.UTC)).total_seconds())
    reread = max(1, min(GCS_REREAD_S, left))
    return GCS_FILE, json.dumps({"access_token": token, "expires_in": reread, "token_type": "Bearer"})


def credentials_tar(files: Mapping[str, str], extra: Mapping[str, str] | None = None) -> bytes:
    """A tar of `files` (path below creds/ -> text) under creds/, and `extra` (path -> text) at its top:
    files 0600, folders 0700."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entries = {**(extra or {}), **{f"{CREDS_DIR}/{path}": text for path, text in files.items()}}
        folders = sorted({p.rsplit("/", 1)[0] for p in entries if "/" in p}, key=len)
        for folder in _with_parents(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for path, text in entries.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _with_parents(folders: list[str]) -> list[str]:
    found: set[str] = set()
    for folder in folders:
        parts = folder.split("/")
        found.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(found, key=lambda f: (f.count("/"), f))


# sky_creds_server: sets creds_port, creds_pass, creds_auth (base64 of sky:<pass>) of the node's credential
#   server; starts one when none answers (with the port and password the running mounts were started with,
#   when there are such mounts: they keep fetching from it). Returns 1 when none could be started.
# sky_creds_ping PORT PASS: whether PORT is this node's server (it serves creds/ready to that password).
# sky_cred_env STORE KEY: export what a STORE rclone needs to fetch mount KEY's credential from the server.
# sky_put_creds STAGED [live]: move the credential files of folder STAGED into creds/ one by one (a rename:
#   the server never serves half a file); with `live`, only those of mounts whose rclone runs. Prints how
#   many it placed.
SERVER_FUNCTIONS = f"""\
{MARKED}
sky_creds_ping() {{
  local reply want
  want=$(cat {CREDS}/ready 2>/dev/null) || return 1
  reply=$(exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /ready HTTP/1.0\\r\\nAuthorization: Basic %s\\r\\n\\r\\n' "$(printf 'sky:%s' "$2" | base64 -w0)" >&3
    timeout 5 cat <&3 | head -c 4096) 2>/dev/null || return 1
  case $reply in *"$want"*) return 0;; esac
  return 1
}}
sky_creds_server() {{
  local pid entry try i
  entry=
  for pid in $(marked {SERVER_ENTRY}); do
    entry=$(tr '\\0' '\\n' < "/proc/$pid/environ" 2>/dev/null | sed -n 's/^{CREDS_ENV}=\\([0-9]*:[0-9a-f]*\\)$/\\1/p' | head -n 1)
    if [ -n "$entry" ] && sky_creds_ping "${{entry%%:*}}" "${{entry#*:}}"; then
      creds_port=${{entry%%:*}} creds_pass=${{entry#*:}}; creds_auth=$(printf 'sky:%s' "$creds_pass" | base64 -w0)
      return 0
    fi
    kill "$pid" 2>/dev/null || true
  done
  # None answers: start one, where the running mounts look for it if there are any.
  entry=$(grep -hzo -- '^{CREDS_ENV}=[0-9]*:[0-9a-f]*' $(own_environs) /dev/null 2>/dev/null | tr '\\0' '\\n' | head -n 1)
  entry=${{entry#{CREDS_ENV}=}}
  [ -n "$entry" ] || entry="$(( 20000 + RANDOM % 40000 )):$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
  (umask 077 && mkdir -p {CREDS} && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {CREDS}/ready)
  for try in 1 2 3 4 5; do
    creds_port=${{entry%%:*}} creds_pass=${{entry#*:}}
    {SERVER_ENTRY} {CREDS_ENV}="$entry" RCLONE_USER=sky RCLONE_PASS="$creds_pass" setsid rclone serve http {CREDS} \\
      --addr "127.0.0.1:$creds_port" --dir-cache-time 0s --config /dev/null --log-level ERROR \\
      --log-file {CREDS}.log </dev/null >/dev/null 2>&1 &
    pid=$! i=0
    while [ $i -lt 100 ] && kill -0 "$pid" 2>/dev/null; do
      if sky_creds_ping "$creds_port" "$creds_pass"; then
        creds_auth=$(printf 'sky:%s' "$creds_pass" | base64 -w0); return 0
      fi
      sleep 0.1; i=$((i+1))
    done
    kill "$pid" 2>/dev/null || true
    entry="$(( 20000 + RANDOM % 40000 )):$creds_pass"  # the port is taken: another one
  done
  echo "the node's credential server (rclone serve http) did not start: $(tail -n 3 {CREDS}.log 2>/dev/null)" >&2
  return 1
}}
sky_cred_env() {{
  export {CREDS_ENV}="$creds_port:$creds_pass"
  case $1 in
    s3)
      export AWS_CONTAINER_CREDENTIALS_FULL_URI="http://127.0.0.1:$creds_port/$2/{S3_FILE}"
      export AWS_CONTAINER_AUTHORIZATION_TOKEN="Basic $creds_auth"
      export AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_CONFIG_FILE=/dev/null
      unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE;;
    gcs)
      export GCE_METADATA_HOST="sky:$creds_pass@127.0.0.1:$creds_port/$2"
      unset GOOGLE_APPLICATION_CREDENTIALS;;
  esac
}}
sky_put_creds() {{
  local staged=$1 only=${{2:-}} dir key f n=0
  for dir in "$staged"/m-*; do
    [ -d "$dir" ] || continue
    key=${{dir##*/}}
    if [ "$only" = live ] && [ -z "$(marked "{MOUNT_MARK_ENV}=$key")" ]; then continue; fi
    while IFS= read -r f; do
      (umask 077 && mkdir -p "$(dirname {CREDS}/"$key/$f")") && mv -f -- "$dir/$f" {CREDS}/"$key/$f"
      n=$((n+1))
    done < <(cd "$dir" && find . -type f -printf '%P\\n')
  done
  rm -rf -- "$staged"
  echo "$n"
}}"""


def refresh_script() -> str:
    """Replace the credentials of the node's running mounts (a tar of creds/<key>/... on stdin) and make
    sure the credential server answers (a server that died is started again where the mounts look for
    it). Files of mounts that no longer run are dropped. Prints `refreshed <n>`."""
    return f"""\
set -eu
{SERVER_FUNCTIONS}
m0="$HOME"/{MOUNTS_DIR}
(umask 077 && mkdir -p "$m0")
staged=$(umask 077 && mktemp -d "$m0/.creds-XXXXXX")
tar -xf - -C "$staged"
n=$(sky_put_creds "$staged/{CREDS_DIR}" live)
if [ "$n" -gt 0 ]; then sky_creds_server; fi
echo "refreshed $n"
"""
