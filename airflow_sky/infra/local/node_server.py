"""One node of the embedded local cluster: an SSH + SFTP server on its own loopback address.

Run as `python -m airflow_sky.infra.local.node_server NODE_DIR` by the local cloud driver (never by hand). Every
command runs under bash with HOME = the node's home and the caller's PATH, in a new session, so the node
behaves like a small machine of its own: `~/sky_workdir` differs per node, `setsid` jobs outlive the SSH
connection, and rsync/scp/paramiko work as against a real sshd. SFTP is chrooted to the node home.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import pty
import shutil
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import asyncssh
import psutil

from airflow_sky.infra.local import layout

# Grace between SIGHUP and SIGKILL for a foreground command whose client went away (sshd does the same HUP).
_HANGUP_GRACE_S = 2.0
_PR_SET_CHILD_SUBREAPER = 36
_REAP_INTERVAL_S = 1.0


class _NodeServer(asyncssh.SSHServer):
    """Accepts only the cluster key (asyncssh checks authorized_client_keys); any user name maps to the node."""

    def begin_auth(self, username: str) -> bool:
        return True


class _NodeSFTPServer(asyncssh.SFTPServer):
    """asyncssh's SFTP server, except that opening a FIFO fails instead of blocking.

    asyncssh opens files on the node's event loop: a FIFO a job left where a reader looks would block
    every session of the node until a writer came (sshd's sftp-server blocks only its own session).
    """

    def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> object:
        if pflags & (asyncssh.FXF_WRITE | asyncssh.FXF_APPEND | asyncssh.FXF_CREAT):
            return super().open(path, pflags, attrs)
        # Non-blocking open, then a look at what was opened: no window for a swap in between.
        fd = os.open(self.map_path(path), os.O_RDONLY | os.O_NONBLOCK)
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise asyncssh.SFTPFailure(f"{path.decode(errors='replace')} is a FIFO")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return open(fd, "rb", buffering=0)


def _command_env(home: Path, marker: str, base_env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    env = dict(base_env)
    env.update(extra)
    env.update(
        {
            "HOME": str(home),
            "PWD": str(home),
            "SHELL": "/bin/bash",
            layout.NODE_MARKER_ENV: marker,
            layout.NODE_ROOT_ENV: base_env.get(layout.NODE_ROOT_ENV, ""),
        }
    )
    return env


class _ProcessRunner:
    """Serves one SSH session: an exec command or an interactive shell, as a bash subprocess."""

    def __init__(self, home: Path, marker: str, base_env: dict[str, str]) -> None:
        self.own_children: set[int] = set()
        self._home = home
        self._marker = marker
        self._base_env = base_env

    async def __call__(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command
        argv = ["bash", "-c", command] if command is not None else ["bash", "-l"]
        client_env = {k: v for k, v in (process.env or {}).items() if k in ("TERM", "LANG", "LC_ALL")}
        env = _command_env(
            self._home, self._marker, self._base_env, {str(k): str(v) for k, v in client_env.items()}
        )
        if process.get_terminal_type():
            env["TERM"] = process.get_terminal_type() or "xterm"
            rc = await self._run_with_pty(process, argv, env)
        else:
            rc = await self._run_with_pipes(process, argv, env)
        process.exit(rc)

    async def _run_with_pipes(
        self, process: asyncssh.SSHServerProcess[bytes], argv: list[str], env: dict[str, str]
    ) -> int:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self._home,
            env=env,
            start_new_session=True,
        )
        self.own_children.add(proc.pid)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # Explicit pumps rather than process.redirect(): the exit status must follow the last output byte.
        feeding = asyncio.ensure_future(_pump_stdin(process.stdin, proc.stdin))
        output: asyncio.Future[Any] = asyncio.gather(
            _pump(proc.stdout, process.stdout), _pump(proc.stderr, process.stderr)
        )
        closed = asyncio.ensure_future(process.wait_closed())
        await asyncio.wait({output, closed}, return_when=asyncio.FIRST_COMPLETED)
        # A pump that failed (the client closed the channel mid-output) also means the client is gone: the
        # command would otherwise block on a full pipe forever, where sshd's writer gets SIGPIPE.
        gone = not output.done() or output.exception() is not None
        rc = await self._wait(proc, client_gone=gone)
        feeding.cancel()
        closed.cancel()
        if not output.done():
            output.cancel()
        return rc

    async def _run_with_pty(
        self, process: asyncssh.SSHServerProcess[bytes], argv: list[str], env: dict[str, str]
    ) -> int:
        master, slave = pty.openpty()
        width, height, _, _ = process.get_terminal_size()
        if width and height:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, cwd=self._home, env=env, start_new_session=True
        )
        self.own_children.add(proc.pid)
        os.close(slave)
        reader = os.fdopen(master, "rb", buffering=0)
        writer = os.fdopen(os.dup(master), "wb", buffering=0)
        await process.redirect(stdin=writer, stdout=reader)
        closed = asyncio.ensure_future(process.wait_closed())
        done = asyncio.ensure_future(proc.wait())
        await asyncio.wait({closed, done}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        return await self._wait(proc, client_gone=not done.done())

    async def _wait(self, proc: asyncio.subprocess.Process, client_gone: bool) -> int:
        if client_gone and proc.returncode is None:
            # The client went away: hang up the command's process group, as sshd does.
            _signal_group(proc.pid, signal.SIGHUP)
            try:
                await asyncio.wait_for(proc.wait(), _HANGUP_GRACE_S)
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
        rc = await proc.wait()
        self.own_children.discard(proc.pid)
        return rc if rc >= 0 else 128 - rc


async def _pump(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    while chunk := await source.read(65536):
        sink.write(chunk)
        await sink.drain()


async def _pump_stdin(source: asyncssh.SSHReader[bytes], sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sink.close()


def _become_subreaper() -> None:
    """Adopt the node's orphans (setsid jobs whose launcher exited), as a machine's init would.

    Without this they reparent to the host's PID 1, which in containers often never reaps them: a finished
    job would then linger as a zombie and still look alive to `kill -0`. And a job that clears its
    environment (`env -i`) and double-forks stays in this server's tree: stopping the node ends it
    (daemon.kill_marked, _end_own_processes).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


async def _reap_orphans(own_children: set[int]) -> None:
    """Reap adopted orphans. Our own subprocesses are left to asyncio, which waits for them by pid.

    `waitid(WNOWAIT)` peeks at a dead child without reaping it, so the check costs one system call while
    nothing died: sixty idle nodes on one machine must not keep its cores busy.
    """
    while True:
        await asyncio.sleep(_REAP_INTERVAL_S)
        zombies: set[int] = set()
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None or info.si_pid in zombies:
                break
            if info.si_pid in own_children:
                break  # asyncio's watcher reaps it; waitid keeps returning the same child until then
            zombies.add(info.si_pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, os.WNOHANG)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _own_tmp(node_dir: Path, record: dict[str, Any], isolated: bool) -> tuple[Path, str]:
    """Give the node a /tmp of its own; returns the node dir as still reachable, and the node's TMPDIR.

    In its own mount namespace the node's tmp dir is bind-mounted over /tmp. The node dir may lie under /tmp
    (a state root there): it is reached as /proc/self/fd/<its parent>/<name> from then on (not the fd
    itself: a symlink, which an autodown's rmtree refuses). Without namespaces, TMPDIR is the node's tmp dir.
    """
    tmp = record.get("tmp")
    if not tmp:
        return node_dir, os.environ.get("TMPDIR", "/tmp")
    Path(tmp).mkdir(mode=0o700, parents=True, exist_ok=True)
    if not isolated:
        return node_dir, str(tmp)
    absolute = Path(os.path.abspath(node_dir))
    parent = os.open(absolute.parent, os.O_RDONLY | os.O_DIRECTORY)
    reachable = Path(f"/proc/self/fd/{parent}") / absolute.name
    software = _software_under_tmp()
    host_tmp = Path(f"{tmp}.host")  # the machine's /tmp, seen for a moment beside the node's
    host_tmp.mkdir(mode=0o700, exist_ok=True)
    _mount("--rbind", "/tmp", str(host_tmp))
    _mount("--bind", str(tmp), "/tmp")
    for top in software:
        # Installed software stays where it is, as on a machine whose image has it: this interpreter,
        # its packages and the node's PATH (a venv or checkout under /tmp) are bound back into the new /tmp.
        Path("/tmp", top).mkdir(exist_ok=True)
        _mount("--rbind", str(host_tmp / top), f"/tmp/{top}")
    subprocess.run(["umount", "--lazy", str(host_tmp)], check=True, capture_output=True)
    host_tmp.rmdir()
    return reachable, "/tmp"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _software_under_tmp() -> list[str]:
    """Top-level entries of /tmp that hold this interpreter, its imports or the node's PATH."""
    here = os.getcwd()  # the node dir: not the node's business
    # This package itself too: an editable install imports it from its checkout, not from sys.path.
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, __file__, *sys.path]
    paths += os.environ.get("PATH", "").split(os.pathsep)
    tops: set[str] = set()
    for path in paths:
        # Relative entries (`''`, an import hook's name) are not places on disk.
        if not os.path.isabs(path) or os.path.abspath(path) == here:
            continue
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            parts = Path(candidate).parts
            if len(parts) >= 3 and parts[:2] == ("/", "tmp"):
                tops.add(parts[2])
    return sorted(tops)


# What a node's server allows besides commands and SFTP: scp (rsync-less copies), no X11 or agent
# forwarding; bytes, not text, on every channel; keepalives that find a client gone.
_SERVER_POLICY: dict[str, Any] = {
    "encoding": None,
    "allow_scp": True,
    "x11_forwarding": False,
    "agent_forwarding": False,
    "keepalive_interval": 15,
}


async def _serve(node_dir: Path, isolated: bool) -> None:
    record = layout.read_node_record(node_dir)
    home = Path(record.get("home") or layout.node_home(node_dir))
    home.mkdir(parents=True, exist_ok=True)
    node_dir, tmpdir = _own_tmp(node_dir, record, isolated)
    marker = os.environ[layout.NODE_MARKER_ENV]
    # The server started from daemon.node_environment; what it needed for itself stays with it.
    base_env = {k: v for k, v in os.environ.items() if k not in ("PWD", "OLDPWD", *layout.SERVER_ONLY_ENV)}
    base_env["TMPDIR"] = tmpdir
    if record.get("cuda_visible_devices") is not None:  # its share of this machine's GPUs (none: "")
        base_env["CUDA_VISIBLE_DEVICES"] = str(record["cuda_visible_devices"])
    runner = _ProcessRunner(home, marker, base_env)
    _become_subreaper()
    reaper = asyncio.ensure_future(_reap_orphans(runner.own_children))

    def sftp_factory(chan: asyncssh.SSHServerChannel[bytes]) -> asyncssh.SFTPServer:
        return _NodeSFTPServer(chan, chroot=str(home).encode())

    options: dict[str, Any] = {
        "server_host_keys": [str(layout.host_key_path(node_dir))],
        "authorized_client_keys": str(layout.authorized_keys_path(node_dir)),
        "process_factory": runner,
        "sftp_factory": sftp_factory,
        **_SERVER_POLICY,
    }
    try:
        server = await asyncssh.create_server(_NodeServer, record["ip"], int(record["port"]), **options)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        # Something else holds the preferred port on every address: take any free one (recorded in ready.json).
        server = await asyncssh.create_server(_NodeServer, record["ip"], 0, **options)
    port = server.sockets[0].getsockname()[1]
    layout.write_json_atomic(layout.ready_path(node_dir), {"pid": os.getpid(), "port": port})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    poweroff = asyncio.ensure_future(_watch_poweroff(home, node_dir, stop))
    await stop.wait()
    poweroff.cancel()
    reaper.cancel()
    server.close()
    await server.wait_closed()
    state = layout.read_node_record(node_dir).get("state")
    if state in (layout.STATE_STOPPED, layout.STATE_TERMINATED):
        _end_own_processes(marker)
    if state == layout.STATE_TERMINATED:  # autodown: nothing of the node stays, as after a teardown
        for path in (home, Path(record.get("tmp") or tmpdir), node_dir):
            shutil.rmtree(path, ignore_errors=True)


async def _watch_poweroff(home: Path, node_dir: Path, stop: asyncio.Event) -> None:
    """Act on the node's own poweroff request (autostop): `stop` keeps its disk, `down` ends it for good."""
    request = home / layout.POWEROFF_PATH
    while not stop.is_set():
        await asyncio.sleep(1.0)
        try:
            how = request.read_text().strip()
        except OSError:
            continue
        request.unlink(missing_ok=True)
        record = layout.read_node_record(node_dir)
        record["state"] = layout.STATE_TERMINATED if how == "down" else layout.STATE_STOPPED
        record["stopped_at"] = time.time()
        layout.write_json_atomic(layout.node_record_path(node_dir), record)
        layout.ready_path(node_dir).unlink(missing_ok=True)
        stop.set()


def _end_own_processes(marker: str) -> None:
    """The node's processes end with it, as a VM's do (in a PID namespace the kernel does it anyway): the
    marked ones, and every descendant of this server (a job that cleared its environment is one: the server
    is their subreaper). Stopped first, so that none forks past the look."""
    root = os.environ.get(layout.NODE_ROOT_ENV)
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            environ = proc.environ()
            own = environ.get(layout.NODE_MARKER_ENV) == marker and environ.get(layout.NODE_ROOT_ENV) == root
            if own and proc.pid != os.getpid():
                found[proc.pid] = proc
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        with contextlib.suppress(psutil.Error):
            found.update({p.pid: p for p in psutil.Process().children(recursive=True)})
        for proc in found.values():
            with contextlib.suppress(psutil.Error, OSError):
                proc.send_signal(sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("node_dir", type=Path)
    parser.add_argument("--isolated", action="store_true", help="in its own PID and mount namespace")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(args.node_dir, args.isolated))
    except (OSError, subprocess.CalledProcessError) as e:
        # The launcher reads this file to report why the node did not come up.
        error: dict[str, Any] = {"error": f"{type(e).__name__}: {e}"}
        layout.write_json_atomic(layout.ready_path(args.node_dir), error)
        print(json.dumps(error), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
