"""The container runtime on a node (`image_id: docker:<image>`): start, run a job's script inside, stop.

One container per node, named by the worker from the node's instance id (container_name): every job of
the cluster runs in it, so what a job leaves outside its mounts stays for the next (SkyPilot's semantics).
Docker or Podman, whichever the node has (`[sky] container_runtime` picks one); host networking, so ranks
reach each other at SKYPILOT_NODE_IPS as without a container; the node's home is bound at the same path
(workdir, job records, bucket mounts under it), and so is every absolute file_mounts destination.

The job's wrapper (launch.sh) stays on the node itself and runs only the script inside (`<rt> exec`): the
mounts' flush reads the node's processes, and the exit code lands in the job dir as before. The script's
processes carry the job's mark in their environment (`-e`), so cancellation finds them from the node as it
finds any job's; a root-owned container (Docker's daemon) is also reached from inside (kill_inside).

A private registry's password goes to `login --password-stdin` on stdin, into a temporary auth file that is
removed once the pull is done: never a command line, a log or the node's disk after the pull.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Iterable, Sequence

from airflow_sky.errors import RemoteError, SpecError
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container_login import boot_wait_function, identity_login
from airflow_sky.node.processes import MARKED
from airflow_sky.node.record import Node
from airflow_sky.node.settings import sky_setting
from airflow_sky.task.container import ContainerSpec, RegistryLogin

RUNTIMES = ("docker", "podman")
NAME_PREFIX = "airflow-sky-"
LABEL = "airflow-sky.node"
CLUSTER_LABEL = "airflow-sky.cluster"  # `docker ps --filter label=airflow-sky.cluster=NAME` lists a cluster's
PULL_TIMEOUT_S = 3600.0  # an NGC image is 10-20 GB
# What the container runs while no job does: a shell that ends on `stop`. bash is what jobs need anyway.
_IDLE = 'trap "exit 0" TERM; sleep infinity & wait'

# Exit codes of the ensure script, each turned into one clear error naming the image.
_NO_RUNTIME, _LOGIN_FAILED, _PULL_FAILED, _RUN_FAILED, _NO_SHELL, _OTHER_IMAGE = 3, 4, 5, 6, 7, 8


def deployment_settings() -> tuple[str, tuple[str, ...]]:
    """The deployment's `[sky] container_runtime` (auto, docker, podman) and `[sky] docker_run_options`
    (words added to every `docker run`, before the task's `config.docker.run_options`)."""
    runtime = sky_setting("container_runtime") or "auto"
    raw = sky_setting("docker_run_options") or ""
    try:
        options = tuple(shlex.split(raw))
    except ValueError as e:
        raise SpecError(f"[sky] docker_run_options: {raw!r}: {e}") from None
    return runtime, options


def container_name(node: Node) -> str:
    """The node's container: derived by the worker from the instance id the infra reported, never read
    from the node (a job cannot point a later one at a container of its own)."""
    return instance_container_name(node.instance_id)


def instance_container_name(instance_id: str) -> str:
    return NAME_PREFIX + hashlib.sha256(instance_id.encode()).hexdigest()[:20]


def pick_runtime_function(preferred: str = "auto") -> str:
    """Shell: `sky_runtime` prints docker or podman, whichever works here (Docker needs its daemon up),
    or fails. `preferred` (`[sky] container_runtime`) names one."""
    if preferred not in ("auto", *RUNTIMES):
        raise SpecError(f"[sky] container_runtime: {preferred!r}; allowed: auto, docker, podman")
    order = RUNTIMES if preferred == "auto" else (preferred,)
    tries = " ".join(order)
    return f"""\
sky_runtime() {{
  local rt
  for rt in {tries}; do
    command -v "$rt" >/dev/null 2>&1 || continue
    [ "$rt" = docker ] && ! timeout 20 docker info >/dev/null 2>&1 && continue
    echo "$rt"; return 0
  done
  return 1
}}"""


# The runtime that holds the container named $1 (a node can have both; the one that started it serves it).
_HOLDER = """\
sky_holder() {
  local rt
  for rt in docker podman; do
    command -v "$rt" >/dev/null 2>&1 || continue
    timeout 30 "$rt" container inspect "$1" >/dev/null 2>&1 && { echo "$rt"; return 0; }
  done
  return 1
}"""


def gpu_options(runtime_var: str = "$rt") -> str:
    """Shell words mapping the node's GPUs into the container (Docker's --gpus, Podman's CDI device)."""
    return f'$( [ "{runtime_var}" = docker ] && echo "--gpus all" || echo "--device nvidia.com/gpu=all" )'


def ensure_command(
    spec: ContainerSpec,
    name: str,
    *,
    binds: Iterable[str] = (),
    deployment_options: Sequence[str] = (),
    gpus: bool = False,
    preferred: str = "auto",
    cluster: str = "",
    identity: str = "",
) -> str:
    """Shell that makes the node's container run `spec.image` (idempotent): an existing one of the same
    image is started if stopped and kept; one of another image is an error; none is pulled (the login, if
    any, is read from stdin: username, password, server, one per line) and started. Prints one line:
    `reused <runtime>` or `started <runtime> <seconds the pull took>`. Nothing is left behind on failure.
    `identity`: shell that logs in as the node's cloud identity when no username was read
    (container_login.identity_login); a cloud node's boot prep is waited for before the runtime pick."""
    q = shlex.quote
    bind_words = " ".join(f"-v {q(p + ':' + p)}" for p in sorted(set(binds)))
    options = " ".join(q(w) for w in [*deployment_options, *spec.run_options])
    gpu = gpu_options() if gpus else ""
    return f"""\
set -u
{pick_runtime_function(preferred)}
{_HOLDER}
{boot_wait_function()}
name={q(name)}
image={q(spec.image)}
IFS= read -r user || user=
IFS= read -r pass || pass=
IFS= read -r server || server=
same_image() {{
  local have
  have=$(timeout 60 "$rt" container inspect --format '{{{{.Config.Image}}}}' "$name" 2>/dev/null)
  case "$have" in
    "$image"|docker.io/"$image"|docker.io/library/"$image"|localhost/"$image") ;;
    *) echo "this node's container runs $have; the job asks for $image (a cluster runs one image: down it, or launch on another cluster)" >&2; exit {_OTHER_IMAGE};;
  esac
}}
if rt=$(sky_holder "$name"); then
  same_image
  state=$(timeout 60 "$rt" container inspect --format '{{{{.State.Status}}}}' "$name" 2>/dev/null)
  if [ "$state" != running ]; then
    timeout 120 "$rt" start "$name" >/dev/null 2>&1 || {{ echo "could not start the container again ($state)" >&2; exit {_RUN_FAILED}; }}
  fi
  echo "reused $rt"; exit 0
fi
sky_boot_wait
rt=$(sky_runtime) || {{ echo "no container runtime: install Docker (with its daemon running) or Podman on the node" >&2; exit {_NO_RUNTIME}; }}
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
if [ -n "$user" ]; then
  export DOCKER_CONFIG="$tmp" REGISTRY_AUTH_FILE="$tmp/auth.json"
  printf '%s\\n' "$pass" | timeout 120 "$rt" login --username "$user" --password-stdin ${{server:+"$server"}} > "$tmp/login.out" 2>&1 || {{
    echo "login to ${{server:-the registry}} as $user failed: $(tail -c 400 "$tmp/login.out")" >&2; exit {_LOGIN_FAILED}; }}
fi
{identity}
pass=
t0=$(date +%s)
case "$image" in
  localhost/*) timeout 60 "$rt" image inspect "$image" >/dev/null 2>&1 || {{
    echo "no image $image on this node (localhost/ images are built on the node, never pulled)" >&2; exit {_PULL_FAILED}; }};;
  *) timeout {int(PULL_TIMEOUT_S)} "$rt" pull "$image" > "$tmp/pull.out" 2>&1 || {{
    echo "pull failed: $(tail -c 600 "$tmp/pull.out" | tr '\\n' ' ')" >&2; exit {_PULL_FAILED}; }};;
esac
pulled=$(( $(date +%s) - t0 ))
if ! timeout 300 "$rt" run -d --name "$name" --label {q(LABEL)}="$name" --label {q(CLUSTER_LABEL + "=" + cluster)} --network host \\
    -v "$HOME:$HOME" {bind_words} {gpu} {options} \\
    --entrypoint /bin/bash "$image" -c {q(_IDLE)} > "$tmp/run.out" 2>&1; then
  if grep -qiE 'already in use|already exists' "$tmp/run.out"; then  # another job's sync started it just now
    same_image; echo "reused $rt"; exit 0
  fi
  timeout 120 "$rt" rm -f "$name" >/dev/null 2>&1
  if grep -qE '/bin/bash.*(no such file|not found)|executable file not found' "$tmp/run.out"; then
    echo "the image has no /bin/bash (images must be Debian-based, with bash): $(tail -c 300 "$tmp/run.out" | tr '\\n' ' ')" >&2; exit {_NO_SHELL}
  fi
  echo "could not start it: $(tail -c 600 "$tmp/run.out" | tr '\\n' ' ')" >&2; exit {_RUN_FAILED}
fi
if ! timeout 60 "$rt" exec "$name" /bin/bash -c true > "$tmp/run.out" 2>&1; then
  timeout 120 "$rt" rm -f "$name" >/dev/null 2>&1
  echo "the image has no working /bin/bash (images must be Debian-based, with bash): $(tail -c 300 "$tmp/run.out" | tr '\\n' ' ')" >&2; exit {_NO_SHELL}
fi
echo "started $rt $pulled"
"""


def ensure_container(
    client: NodeClient,
    spec: ContainerSpec,
    login: RegistryLogin | None,
    log: Callable[[str], None],
    *,
    binds: Iterable[str] = (),
    deployment_options: Sequence[str] = (),
    preferred: str = "auto",
    cluster: str = "",
) -> str:
    """Start (or keep) the node's container (labelled with its `cluster`); returns the runtime. Raises
    RemoteError naming the image."""
    node = client.node
    name = container_name(node)
    command = ensure_command(
        spec,
        name,
        binds=binds,
        deployment_options=deployment_options,
        gpus=node.gpus > 0,
        preferred=preferred,
        cluster=cluster,
        identity=identity_login(spec.image) if login is None else "",
    )
    stdin = "\n".join([login.username, login.password, login.server] if login else ["", "", ""]) + "\n"
    rc, out, err = client.exec(command, stdin=stdin.encode(), timeout=PULL_TIMEOUT_S + 600)
    words = out.decode(errors="replace").strip().rpartition("\n")[2].split()
    if rc != 0 or not words:
        reason = err.decode(errors="replace").strip().splitlines()
        detail = reason[-1] if reason else f"exit code {rc}"
        if login is not None:
            detail = detail.replace(login.password, "***")
        raise RemoteError(f"container image {spec.image} on node rank {node.rank}: {detail}")
    if words[0] == "started":
        seconds = words[2] if len(words) > 2 else "?"
        log(f"rank {node.rank}: pulled {spec.image} with {words[1]} in {seconds}s and started its container")
    else:
        log(f"rank {node.rank}: {spec.image} already runs in this node's container ({words[1]})")
    return words[1]


def exec_words(name: str, env_names: Iterable[str], workdir: str = '"$HOME/sky_workdir"') -> str:
    """Shell words, inside launch.sh, that run what follows in the node's container with the job's env:
    each variable passed by name (`-e NAME` takes the value from the wrapper, so no value is on a command
    line). The container is started again first if it was stopped (a node that was stopped and started)."""
    names = " ".join(f"-e {shlex.quote(n)}" for n in sorted(set(env_names)))
    q = shlex.quote(name)
    return f'"$rt" exec -w {workdir} {names} {q}' if names else f'"$rt" exec -w {workdir} {q}'


def launch_prelude(name: str) -> str:
    """Shell for launch.sh: find the runtime that holds the container (`rt`), start it if stopped."""
    q = shlex.quote(name)
    return f"""\
{_HOLDER}
  if ! rt=$(sky_holder {q}); then
    echo "airflow-sky: this node's container {name} is gone (the node was replaced or cleaned): the job cannot run" >> "$d/log"
    rt=false
  elif [ "$(timeout 60 "$rt" container inspect --format '{{{{.State.Status}}}}' {q} 2>/dev/null)" != running ]; then
    timeout 120 "$rt" start {q} >/dev/null 2>&1 || true
  fi"""


def kill_inside(name: str, kill_script: str, mark: str) -> str:
    """Shell: run `kill_script` inside the node's container too, as the container's user (a root-owned
    container's processes cannot be signalled by the node's user from outside) — only when a process of
    the job (`mark`, its environment entry) is a runtime's `exec` into that container: a job that never ran
    in one costs no runtime call."""
    q = shlex.quote(name)
    return f"""\
{MARKED}
{_HOLDER}
inside=0
for p in $(marked {shlex.quote(mark)}); do
  case "$(tr '\\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)" in
    docker\\ *exec*{name}*|podman\\ *exec*{name}*|*/docker\\ *exec*{name}*|*/podman\\ *exec*{name}*) inside=1;;
  esac
done
if [ "$inside" = 1 ] && rt=$(sky_holder {q}); then
  timeout 120 "$rt" exec -e HOME="$HOME" {q} /bin/bash -c {shlex.quote(kill_script)} >/dev/null 2>&1 || true
fi"""


def remove_command(names: Iterable[str]) -> str:
    """Shell: remove these containers wherever they are (docker and podman), ignoring absent ones."""
    words = " ".join(shlex.quote(n) for n in names)
    if not words:
        return "true"
    return f"""\
for rt in docker podman; do
  command -v "$rt" >/dev/null 2>&1 || continue
  [ "$rt" = docker ] && ! timeout 20 docker info >/dev/null 2>&1 && continue
  # Twice: a container whose monitor died (a killed node) is only marked exited by the first.
  timeout 120 "$rt" rm -f {words} >/dev/null 2>&1 || timeout 120 "$rt" rm -f {words} >/dev/null 2>&1 || true
done"""


def remove_container(client: NodeClient) -> None:
    """Remove the node's container (at teardown); best effort, the node is going anyway."""
    rc, _, err = client.exec(remove_command([container_name(client.node)]), timeout=300)
    if rc != 0:
        raise RemoteError(
            f"could not remove the container of node rank {client.node.rank}: {err.decode(errors='replace')}"
        )


def describe_runtimes(probe: Callable[[str], bool]) -> str:
    """What `check` says about a machine's container runtimes; `probe(cmd)` runs a shell command there."""
    found = [rt for rt in RUNTIMES if probe(f"command -v {rt} >/dev/null 2>&1")]
    if "docker" in found and not probe("timeout 20 docker info >/dev/null 2>&1"):
        found = [rt for rt in found if rt != "docker"] + (["docker (its daemon is not reachable)"])
    return ", ".join(found) if found else "none (install Docker or Podman for image_id: docker:...)"
