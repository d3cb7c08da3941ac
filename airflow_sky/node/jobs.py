"""Detached jobs on a node: start (idempotent), poll the log by offset, kill the process group.

The job record lives on the node, `~/.airflow_sky/jobs/<job_id>/`:
    generation            the current generation (bumped by a recovery relaunch)
    gen-<g>/script.sh     the user's script
    gen-<g>/env           `export K=V` lines, mode 0600 (never on a command line), removed once read
    gen-<g>/launch.sh     the wrapper; gen-<g>/pid (= pgid), gen-<g>/log, gen-<g>/exit_code
    xcom/                 $AIRFLOW_SKY_XCOM_DIR: a job writes return.json here
"""

from __future__ import annotations

import dataclasses
import io
import signal
import tarfile
import time
from collections.abc import Mapping

from airflow_sky.errors import RemoteError
from airflow_sky.node import shell
from airflow_sky.node.autostop import NodeAutostop, arm_command
from airflow_sky.node.client import NodeClient
from airflow_sky.node.paths import JOBS_DIR
from airflow_sky.task import envs

DEFAULT_POLL_BYTES = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class JobStart:
    pid: int | None
    started: bool  # False: this generation was already started (the caller attached to it)


@dataclasses.dataclass(frozen=True)
class JobPoll:
    data: bytes  # new log bytes from the requested offset
    next_offset: int
    log_size: int
    running: bool
    exit_code: int | None  # set once the job finished (or was killed)
    missing: bool = False  # no such job/generation on the node
    pid: int | None = None  # the job's process group id

    @property
    def lost(self) -> bool:
        """Dead without an exit code: the node restarted or the wrapper was killed from outside."""
        return not self.missing and not self.running and self.exit_code is None

    @property
    def caught_up(self) -> bool:
        return self.next_offset >= self.log_size


def _tar(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def start_job(
    client: NodeClient,
    job_id: str,
    script: str,
    env: Mapping[str, str],
    generation: int = 0,
    autostop: NodeAutostop | None = None,
) -> JobStart:
    """Start `script` detached under bash in ~/sky_workdir with `env`; a second call attaches instead.

    With `autostop`, the node's watcher is (re)armed first: every start does it, so a node that replaced a
    lost one is armed like the rest.
    """
    payload = _tar(
        {
            "script.sh": (script.encode(), 0o700),
            "env": (envs.env_file_text(env).encode(), 0o600),
            "launch.sh": (shell.launch_script().encode(), 0o700),
        }
    )
    command = shell.start_command(job_id, generation)
    if autostop is not None:
        command = f"( {arm_command(autostop)} ) >/dev/null 2>&1\n{command}"
    rc, out, err = client.exec(command, stdin=payload, timeout=60)
    if rc != 0:
        raise RemoteError(
            f"could not start job {job_id} on node rank {client.node.rank}: {err.decode(errors='replace').strip()}"
        )
    state, _, pid = out.decode().strip().rpartition("\n")[2].partition(" ")
    return JobStart(pid=int(pid) if pid.isdigit() else None, started=state == "started")


def poll_job(
    client: NodeClient, job_id: str, generation: int, offset: int, max_bytes: int = DEFAULT_POLL_BYTES
) -> JobPoll:
    """New log bytes from `offset` plus the job's state, in one round trip."""
    rc, out, err = client.exec(shell.poll_command(job_id, generation, offset, max_bytes), timeout=60)
    header, _, data = out.partition(b"\n")
    fields = header.decode(errors="replace").split()
    if rc != 0 or len(fields) != 4:
        raise RemoteError(
            f"could not poll job {job_id} on node rank {client.node.rank}: {err.decode(errors='replace').strip()}"
        )
    code, alive, size, pid = fields
    if code == "missing":
        return JobPoll(b"", offset, 0, running=False, exit_code=None, missing=True)
    return JobPoll(
        data=data,
        next_offset=offset + len(data),
        log_size=int(size),
        running=alive == "1" and code == "-",
        exit_code=None if code == "-" else int(code),
        pid=int(pid) if pid.isdigit() else None,
    )


def read_job(
    client: NodeClient,
    job_id: str,
    generation: int,
    offset: int,
    max_bytes: int = DEFAULT_POLL_BYTES,
    want_pid: bool = True,
) -> JobPoll:
    """New log bytes from `offset` and the exit code, over SFTP: no process runs on the node for it.

    A job without an exit code counts as running; only `poll_job` (a shell on the node) can tell a job
    whose processes vanished (`lost`), so watchers ask it now and then, not every poll.
    """
    d = f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/gen-{int(generation)}"
    raw_code = client.read_file(f"{d}/exit_code")  # before the log: a job that has an exit code logs no more
    read = client.read_range(f"{d}/log", offset, max_bytes)
    if read is None:
        return JobPoll(b"", offset, 0, running=False, exit_code=None, missing=True)
    data, size = read
    code = raw_code.strip() if raw_code else b""
    exit_code = int(code) if code.lstrip(b"-").isdigit() else None
    raw_pid = client.read_file(f"{d}/pid") if want_pid else None
    pid = raw_pid.strip() if raw_pid else b""
    return JobPoll(
        data=data,
        next_offset=offset + len(data),
        log_size=size,
        running=exit_code is None,
        exit_code=exit_code,
        pid=int(pid) if pid.isdigit() else None,
    )


def kill_job(
    client: NodeClient,
    job_id: str,
    generation: int,
    sig: signal.Signals = signal.SIGTERM,
    grace_s: float = 5.0,
    record_exit_code: int | None = None,
) -> int | None:
    """Stop the job's whole process group; returns the exit code now recorded (None if it never started)."""
    record = record_exit_code if record_exit_code is not None else 128 + int(sig)
    rc, out, err = client.exec(
        shell.kill_command(job_id, generation, sig, grace_s, record), timeout=grace_s + 60
    )
    if rc != 0:
        raise RemoteError(
            f"could not kill job {job_id} on node rank {client.node.rank}: {err.decode(errors='replace').strip()}"
        )
    words = out.decode().split()
    return int(words[1]) if len(words) == 2 and words[1].lstrip("-").isdigit() else None


def current_generation(client: NodeClient, job_id: str) -> int | None:
    rc, out, _ = client.exec(shell.current_generation_command(job_id), timeout=60)
    text = out.decode().strip()
    return int(text) if rc == 0 and text.isdigit() else None


def read_xcom(
    client: NodeClient, job_id: str, name: str = "return.json", max_bytes: int | None = None
) -> bytes | None:
    """The file a job wrote to $AIRFLOW_SKY_XCOM_DIR/<name>, or None (FileTooLarge above `max_bytes`)."""
    return client.read_file(f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/xcom/{name}", max_bytes=max_bytes)


def recorded_failure(head: NodeClient, job_id: str, generation: int) -> tuple[int, int] | None:
    """The (rank, exit code) recorded as the phase's first failure (see record_failure), or None."""
    raw = head.read_file(f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/gen-{int(generation)}/failure")
    words = raw.decode().split() if raw else []
    return (int(words[0]), int(words[1])) if len(words) == 2 else None


def record_failure(
    head: NodeClient, job_id: str, generation: int, rank: int, exit_code: int
) -> tuple[int, int]:
    """Record `rank` as the phase's first failure unless one is recorded; return the recorded (rank, code)."""
    rc, out, err = head.exec(shell.record_failure_command(job_id, generation, rank, exit_code), timeout=60)
    words = out.decode().split()
    if rc != 0 or len(words) != 2:
        raise RemoteError(
            f"could not record the failure of job {job_id} on the head node: {err.decode(errors='replace').strip()}"
        )
    return int(words[0]), int(words[1])
