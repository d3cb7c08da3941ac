"""A container image's registry login through the node's own cloud identity, and the boot-time container
prep of cloud nodes (aws user data, gcp startup script): pure functions that return shell text.

Identity login (`identity_login`): with neither SKYPILOT_DOCKER_USERNAME nor SKYPILOT_DOCKER_PASSWORD given,
an image in a cloud's registry is pulled as the node itself, as SkyPilot does:
- ECR (`<account>.dkr.ecr.<region>.amazonaws.com/...`): `aws ecr get-login-password` with the instance's
  profile, when the aws CLI is on the node (without it the pull goes anonymous and fails naming the image);
- Artifact Registry (`<region>-docker.pkg.dev/...`) and Container Registry (`[<region>.]gcr.io/...`): an
  access token of the VM's service account (`gcloud auth print-access-token`, or the metadata server), as
  user `oauth2accesstoken`; no token (no service account): anonymous, which public images allow.
  A key file is SkyPilot's other form: username `_json_key`, the key as the password (the normal login).
The token goes from one process to the runtime's `login --password-stdin` by a pipe or a shell variable:
never a command line; the login lands in the ensure step's temporary auth file, removed after the pull.

Boot prep (`boot_prep_script`): run as root at the node's boot, it installs Docker where the VM image has
none, lets the SSH user reach it, and pulls the image in the background, so it is there when the sync's
ensure step runs. It writes what it did, with the times, to PREP_LOG; PREP_RUNNING exists while it runs
(in /run: a reboot clears what a killed prep left). The ensure step waits for it (`boot_wait_function`),
and the provisioning reads its record into the provision log (`prep_report_command`). It holds no secret:
user data and startup scripts are readable by every process on the node (the metadata server).
"""

from __future__ import annotations

import re
import shlex

PREP_RUNNING = "/run/airflow-sky-container-prep"
PREP_LOG = "/var/log/airflow-sky-container-prep.log"
PREP_STARTED = "container prep started"  # the first line of each boot's record
PREP_WAIT_S = 1800  # how long the sync's ensure (and the provisioning's report) wait for a running prep
_LOGIN_FAILED = 4  # the ensure step's exit code for a failed login (node/container.py)

_ECR = re.compile(
    r"^(?P<server>[0-9]{12}\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?)/"
)
_GCP = re.compile(r"^(?P<server>(?:[a-z0-9-]+-docker\.pkg\.dev|(?:[a-z]+\.)?gcr\.io))/")
_METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"


def identity_registry(image: str) -> tuple[str, str, str] | None:
    """(cloud, registry server, region) of an image in a cloud registry a node logs in to as itself;
    None for any other registry. Region is "" for gcp."""
    ecr = _ECR.match(image)
    if ecr:
        return "aws", ecr["server"], ecr["region"]
    gcp = _GCP.match(image)
    if gcp:
        return "gcp", gcp["server"], ""
    return None


def identity_login(image: str) -> str:
    """Shell for the ensure step, run after its runtime pick (`$rt`) and temporary dir (`$tmp`) and only
    when no username was read (`$user` empty): log in to the image's cloud registry as the node. "" for
    an image of another registry. A failed login with a credential in hand exits _LOGIN_FAILED."""
    found = identity_registry(image)
    if found is None:
        return ""
    cloud, server, region = found
    q = shlex.quote
    fail = (
        f"echo \"login to {server} with this node's {{what}} failed: "
        f"$(tail -c 300 \"$tmp/identity.err\" 2>/dev/null | tr '\\n' ' ') $(tail -c 300 \"$tmp/login.out\" | tr '\\n' ' ')"
        f'{{hint}}" >&2; exit {_LOGIN_FAILED}'
    )
    if cloud == "aws":
        hint = " (launch with an iam_instance_profile that may pull from ECR, or give SKYPILOT_DOCKER_USERNAME/PASSWORD)"
        body = f"""\
  if command -v aws >/dev/null 2>&1; then
    timeout 60 aws ecr get-login-password --region {q(region)} 2> "$tmp/identity.err" \\
      | timeout 120 "$rt" login --username AWS --password-stdin {q(server)} > "$tmp/login.out" 2>&1 || {{
      {fail.format(what="instance identity (aws ecr get-login-password)", hint=hint)}; }}
  fi"""
    else:
        hint = " (the VM's service account needs Artifact Registry read access)"
        body = f"""\
  token=$(timeout 30 gcloud auth print-access-token 2> "$tmp/identity.err") || token=
  [ -n "$token" ] || token=$(curl -sf --max-time 5 -H 'Metadata-Flavor: Google' {q(_METADATA_TOKEN)} 2>/dev/null \\
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])' 2>/dev/null) || token=
  if [ -n "$token" ]; then
    printf '%s\\n' "$token" | timeout 120 "$rt" login --username oauth2accesstoken --password-stdin {q(server)} \\
      > "$tmp/login.out" 2>&1 || {{ token=; {fail.format(what="service account", hint=hint)}; }}
  fi
  token="""
    return f"""\
if [ -z "$user" ]; then
  export DOCKER_CONFIG="$tmp" REGISTRY_AUTH_FILE="$tmp/auth.json"
{body}
fi"""


def boot_wait_function(running: str = PREP_RUNNING, wait_s: int = PREP_WAIT_S) -> str:
    """Shell: `sky_boot_wait` returns once the node's boot prep is not running (or after `wait_s`); a
    node without one (local, ssh, a cloud VM of a task without a container) returns at once."""
    return f"""\
sky_boot_wait() {{
  local waited=0
  while [ -e {shlex.quote(running)} ] && [ "$waited" -lt {int(wait_s)} ]; do sleep 2; waited=$((waited + 2)); done
}}"""


def boot_prep_script(image: str, ssh_user: str, log: str = PREP_LOG, running: str = PREP_RUNNING) -> str:
    """The root script a cloud node runs at boot for `image_id: docker:<image>` (see the module doc)."""
    q = shlex.quote
    pull = (
        'say "the image is a localhost/ one: built on the node, never pulled"'
        if image.startswith("localhost/")
        else f"""\
user=
{identity_login(image)}
t1=$(date +%s)
if timeout 3600 docker pull "$image" > "$tmp/pull.out" 2>&1; then
  say "pulled $image in $(( $(date +%s) - t1 ))s (at boot; the job's sync finds it there)"
else
  say "pre-pull of $image failed after $(( $(date +%s) - t1 ))s: $(tail -c 300 "$tmp/pull.out" | tr '\\n' ' ') (the job's sync pulls it, with the task's registry login if it has one)"
fi"""
    )
    return f"""\
#!/bin/bash
# airflow-sky: the container runtime and image of this node (image_id: docker:...), prepared at boot
set -u
running={q(running)}; log={q(log)}; image={q(image)}; owner={q(ssh_user)}
touch "$running"
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"; rm -f -- "$running"' EXIT
exec >> "$log" 2>&1
chmod 644 "$log"
say() {{ echo "$(date -u '+%Y-%m-%d %H:%M:%S') $*"; }}
say "{PREP_STARTED}: image $image"
t0=$(date +%s)
if ! command -v docker >/dev/null 2>&1; then
  say "Docker is not on this VM image: installing it"
  if command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
  elif command -v dnf >/dev/null 2>&1; then dnf install -y -q docker >/dev/null
  elif command -v yum >/dev/null 2>&1; then yum install -y -q docker >/dev/null
  fi
  command -v docker >/dev/null 2>&1 || {{ say "could not install Docker (no apt-get, dnf or yum, or it failed)"; exit 1; }}
  say "installed Docker in $(( $(date +%s) - t0 ))s"
fi
systemctl enable --now docker >/dev/null 2>&1 || service docker start >/dev/null 2>&1 || true
for _ in $(seq 60); do timeout 20 docker info >/dev/null 2>&1 && break; sleep 2; done
timeout 20 docker info >/dev/null 2>&1 || {{ say "Docker's daemon does not answer"; exit 1; }}
if id "$owner" >/dev/null 2>&1; then
  # the SSH user reaches the daemon: the group for later logins, the socket's ACL for the current ones
  usermod -aG docker "$owner" 2>/dev/null || true
  command -v setfacl >/dev/null 2>&1 && setfacl -m "u:$owner:rw" /var/run/docker.sock 2>/dev/null || true
fi
say "Docker ready after $(( $(date +%s) - t0 ))s"
rt=docker
{pull}
"""


def prep_report_command(wait_s: int = PREP_WAIT_S, log: str = PREP_LOG, running: str = PREP_RUNNING) -> str:
    """Shell, run as the SSH user: wait (at most `wait_s`) for the boot prep, then print this boot's
    record of it (its lines from the last start on); a line saying so when there is none or it still runs."""
    q = shlex.quote
    return f"""\
{boot_wait_function(running, wait_s)}
sky_boot_wait
if [ -e {q(running)} ]; then echo "the container prep still runs after {int(wait_s)}s: the job's sync waits for it"; fi
if [ -r {q(log)} ]; then
  awk -v start={q(PREP_STARTED)} 'index($0, start) {{ n = 0 }} {{ lines[n++] = $0 }} END {{ for (i = 0; i < n; i++) print lines[i] }}' {q(log)} | tail -n 40
else
  echo "no container prep record on this node yet (its boot script has not run): the job's sync pulls the image"
fi
"""
