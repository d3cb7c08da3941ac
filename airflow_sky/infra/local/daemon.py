"""Start, find and stop the processes of local nodes.

Every process of a node (its SSH server and everything started through it, detached jobs included)
carries NODE_MARKER_ENV=<cluster>/<instance_id> and NODE_ROOT_ENV=<state root> in its environment, so
stopping a node finds all of them even after `setsid` moved them out of the server's session, and only
those of this state root. A job can clear its environment (`env -i`), but not leave its node's process
tree: the server is a child subreaper (node_server), so whatever a job orphans, double fork and `setsid`
included, is re-parented to it; stopping a node ends the marked processes and all their descendants.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.infra.local import layout


def marker(cluster_name: str, instance_id: str) -> str:
    return f"{cluster_name}/{instance_id}"


# What a local node keeps of the launcher's environment: a cloud VM sees none of an Airflow worker's env
# (its metadata DB URL, fernet key, connections, cloud credentials), and neither does a local node.
# TMPDIR is not kept: every node has a /tmp of its own (node_server sets it).
NODE_ENV_KEPT = ("PATH", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME")
NODE_ENV_KEPT_PREFIXES = ("LC_",)


def node_environment(launcher_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a local node starts from: locale, TZ, user and PATH (with this interpreter's bin)."""
    env = {
        k: v
        for k, v in launcher_env.items()
        if k in NODE_ENV_KEPT or k.startswith(NODE_ENV_KEPT_PREFIXES) or k in layout.SERVER_ONLY_ENV
    }
    # Commands find this interpreter's tools (torchrun, a venv's python) even when the caller did not
    # activate the venv.
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH") or os.defpath
    if bin_dir not in path.split(os.pathsep):
        path = bin_dir + os.pathsep + path
    env["PATH"] = path
    return env


ISOLATION_ENV = "AIRFLOW_SKY_LOCAL_ISOLATION"  # "off": plain processes even where namespaces work
# A node in its own PID and mount namespace: `ps` on it sees its own processes, /tmp is its own, and when
# its server (PID 1 there) dies, everything it ran dies with it, as on a machine that goes away.
_UNSHARE = ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "--propagation", "private"]
_isolation: list[str] | None = None
_isolation_probed = False


def isolation() -> list[str] | None:
    """The command prefix that puts a node in its own namespaces here, or None where the OS refuses.

    As root, plain `unshare`; otherwise inside a user namespace mapping this user to itself (no new uid,
    so files in the node's home stay the user's). Probed once per process.
    """
    global _isolation, _isolation_probed
    if _isolation_probed:
        return _isolation
    _isolation_probed = True
    if os.environ.get(ISOLATION_ENV, "").lower() in ("off", "0", "false", "no") or not shutil.which(
        "unshare"
    ):
        return None
    candidates = [_UNSHARE] if os.geteuid() == 0 else [[_UNSHARE[0], "--map-current-user", *_UNSHARE[1:]]]
    for prefix in candidates:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            probe = subprocess.run(
                [*prefix, "sh", "-c", "mount -t tmpfs none /mnt 2>/dev/null || mount --bind / /mnt"],
                capture_output=True,
                timeout=10,
            )
            if probe.returncode == 0:
                _isolation = prefix
                break
    return _isolation


def check_shared_mounts(destinations: Iterable[str]) -> None:
    """Local nodes share this machine's filesystem: each can mount the same absolute path only from a mount
    namespace of its own (root, or user namespaces). Raises SpecError naming the mount otherwise."""
    shared = list(destinations)
    if shared and isolation() is None:
        raise SpecError(
            f"file_mounts.{shared[0]}: local nodes run without mount namespaces of their own here (not "
            "root, no user namespaces), so they cannot each mount the same absolute path; mount it under "
            f"the node's home instead (file_mounts.~/{shared[0].strip('/')})"
        )


def spawn_server(node_dir: Path, node_marker: str) -> int:
    """Start a node's SSH server detached from the caller (it outlives the Airflow task that started it)."""
    env = node_environment(os.environ)
    env[layout.NODE_MARKER_ENV] = node_marker
    env[layout.NODE_ROOT_ENV] = layout.root_id()
    prefix = isolation()
    argv = [sys.executable, "-m", "airflow_sky.infra.local.node_server", str(node_dir)]
    with open(layout.server_log_path(node_dir), "ab") as log:
        proc = subprocess.Popen(
            [*prefix, *argv, "--isolated"] if prefix else argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=node_dir,
            start_new_session=True,
            close_fds=True,
        )
    # Inside a PID namespace the server knows itself as PID 1: liveness is checked on this pid.
    layout.server_pid_path(node_dir).write_text(str(proc.pid))
    return proc.pid


def wait_ready(node_dirs: Iterable[Path], timeout_s: float = 30.0) -> dict[Path, int]:
    """Wait until every node server listens; return each one's SSH port. Raises ClusterError naming the node."""
    pending = list(node_dirs)
    ports: dict[Path, int] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        for node_dir in list(pending):
            ready = layout.read_json(layout.ready_path(node_dir))
            if ready is None:
                continue
            if "error" in ready:
                raise ClusterError(f"local node {node_dir.name} failed to start: {ready['error']}")
            ports[node_dir] = int(ready["port"])
            pending.remove(node_dir)
        if not pending:
            break
        if time.monotonic() > deadline:
            names = ", ".join(d.name for d in pending)
            raise ClusterError(
                f"local nodes {names} did not start within {timeout_s:.0f}s (see their server.log)"
            )
        time.sleep(0.05)
    return ports


def processes_with_marker(prefix: str) -> list[psutil.Process]:
    """This root's processes whose node marker is `prefix` or starts with `prefix/` (a cluster or one instance)."""
    found = []
    root_id = layout.root_id()
    for proc in psutil.process_iter():
        try:
            environ = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
        value = environ.get(layout.NODE_MARKER_ENV)
        if (
            value is not None
            and (value == prefix or value.startswith(prefix + "/"))
            and environ.get(layout.NODE_ROOT_ENV) == root_id
        ):
            found.append(proc)
    return found


def _with_descendants(procs: Iterable[psutil.Process]) -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        found[proc.pid] = proc
        with contextlib.suppress(psutil.Error):
            found.update({child.pid: child for child in proc.children(recursive=True)})
    return found


def kill_marked(prefix: str, timeout_s: float = 5.0) -> int:
    """SIGKILL every process of a node or cluster, and every descendant of one (a job that cleared its
    environment), and reap; returns how many there were.

    Everything found is stopped first and looked for again: a child forked in between is found as a
    descendant of its stopped parent, and a stopped process forks no more."""
    procs = _with_descendants(processes_with_marker(prefix))
    for proc in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signal.SIGSTOP)
    procs.update(_with_descendants(list(procs.values())))
    for proc in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signal.SIGKILL)
    # Not psutil.wait_procs: a killed process whose parent has not reaped it yet is a zombie (dead, just
    # not buried), and still "exists" for it.
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs.values() if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    if alive:
        pids = ", ".join(str(p.pid) for p in alive)
        raise ClusterError(f"could not stop local node processes {pids} of {prefix}")
    return len(procs)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def server_alive(node_dir: Path, node_marker: str) -> bool:
    """Is the node's SSH server running? Checks pid and marker, so a recycled pid does not count."""
    try:
        pid = int(layout.server_pid_path(node_dir).read_text())
    except (OSError, ValueError):
        return False
    if layout.read_json(layout.ready_path(node_dir)) is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        environ = proc.environ()
        return (
            environ.get(layout.NODE_MARKER_ENV) == node_marker
            and environ.get(layout.NODE_ROOT_ENV) == layout.root_id()
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
