"""Detached jobs on a node: start (idempotent), poll the log by offset, kill the process group.

The job record lives on the node, `~/.airflow_sky/jobs/<job_id>/`:
    gen-<g>/              appears complete, by renaming a staging dir (.stage-<g>-<pid>) with `claimed`
    gen-<g>/script.sh     the user's script
    gen-<g>/env           `export K=V` lines, mode 0600 (never on a command line), removed once read
    gen-<g>/launch.sh     the wrapper; gen-<g>/pid (= pgid), gen-<g>/log, gen-<g>/exit_code
    gen-<g>/lib/          airflow_sky.progress for the job's Python, on its PYTHONPATH (node.python_lib)
    xcom/                 $AIRFLOW_SKY_XCOM_DIR: a job writes return.json here

The job can rewrite all of it. The pid file is shown (log prefixes), never signalled: kills and liveness go
by the mark every process of the generation carries (node.shell.job_mark), which the worker derives from
the job id and generation it holds.
"""

from __future__ import annotations

import dataclasses
import io
import signal
import tarfile
import time
from collections.abc import Mapping, Sequence

from airflow_sky.errors import RemoteError
from airflow_sky.node import container, shell
from airflow_sky.node.autostop import NodeAutostop, arm_command
from airflow_sky.node.client import MAX_SMALL_FILE_BYTES, FileTooLarge, NodeClient, UnsafeRemoteFile
from airflow_sky.node.notice import NoticeWatch, hook_files
from airflow_sky.node.paths import JOBS_DIR
from airflow_sky.node.python_lib import job_python_files
from airflow_sky.node.rclone import FlushedMount
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


def job_files(
    script: str,
    env: Mapping[str, str],
    flush: Sequence[FlushedMount] = (),
    container: str | None = None,
    notice: NoticeWatch | None = None,
    preemption_hooks: Sequence[str] = (),
) -> bytes:
    """The tar stream `shell.start_command` unpacks: the script, its env file, the wrapper (waiting for the
    uploads of the mounts `flush` before the verdict; running the script in the node's `container` when
    there is one; watching for a preemption `notice`, with the `preemption_hooks` to run on one), the job's
    Python helpers and a marker."""
    hooks = {name: (text.encode(), 0o700) for name, text in hook_files(tuple(preemption_hooks)).items()}
    return _tar(
        {
            "script.sh": (script.encode(), 0o700),
            "env": (envs.env_file_text(env).encode(), 0o600),
            "launch.sh": (shell.launch_script(flush, container, sorted(env), notice).encode(), 0o700),
            **hooks,
            **{path: (data, 0o600) for path, data in job_python_files().items()},
            # Last: tar takes a stream cut at a member's header for the archive's end, so only this
            # marker on the node tells that every file arrived.
            shell.UNPACKED_MARKER: (b"", 0o600),
        }
    )


def start_job(
    client: NodeClient,
    job_id: str,
    script: str,
    env: Mapping[str, str],
    generation: int = 0,
    autostop: NodeAutostop | None = None,
    flush: Sequence[FlushedMount] = (),
    container: str | None = None,
    notice: NoticeWatch | None = None,
    preemption_hooks: Sequence[str] = (),
) -> JobStart:
    """Start `script` detached under bash in ~/sky_workdir with `env`; a second call attaches instead.

    With `autostop`, the node's watcher is (re)armed first: every start does it, so a node that replaced a
    lost one is armed like the rest. `flush`: the job's bucket mounts whose uploads its verdict waits for
    (rclone.flushed_mounts). `container`: the node's container (node.container.container_name) the script
    runs in, for a task with `image_id: docker:...`. `notice`: how the node learns of its preemption, and
    `preemption_hooks` the scripts it then runs (node.notice).
    """
    payload = job_files(script, env, flush, container, notice, preemption_hooks)
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
    whose processes vanished (`lost`), so watchers ask it now and then, not every poll. The job can reach
    these files ($AIRFLOW_SKY_JOB_DIR): each read is bounded, and one that is not a regular file is taken
    as not written yet (the wrapper replaces the exit code and pid files by rename) or, for the log, as
    empty.
    """
    d = f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/gen-{int(generation)}"
    exit_code = _read_number(client, f"{d}/exit_code")  # before the log: a job with an exit code logs no more
    try:
        read = client.read_range(f"{d}/log", offset, max_bytes)
    except UnsafeRemoteFile:
        read = (b"", offset)
    if read is None:
        return JobPoll(b"", offset, 0, running=False, exit_code=None, missing=True)
    data, size = read
    pid = _read_number(client, f"{d}/pid") if want_pid else None
    return JobPoll(
        data=data,
        next_offset=offset + len(data),
        log_size=size,
        running=exit_code is None,
        exit_code=exit_code,
        pid=pid if pid is not None and pid > 0 else None,
    )


def read_exit_code(client: NodeClient, job_id: str, generation: int) -> int | None:
    """The job's recorded exit code over SFTP, or None while it has none (bounded, as `read_job`)."""
    d = f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/gen-{int(generation)}"
    return _read_number(client, f"{d}/exit_code")


_NUMBER_FILE_BYTES = 64  # an exit code or a pid, with room to spare


def _read_number(client: NodeClient, path: str) -> int | None:
    """The integer a wrapper file holds; None when absent, not a regular file, too long or not a number."""
    try:
        raw = client.read_file(path, max_bytes=_NUMBER_FILE_BYTES)
    except (UnsafeRemoteFile, FileTooLarge):
        return None
    text = raw.strip() if raw else b""
    return int(text) if text.lstrip(b"-").isdigit() else None


def kill_job(
    client: NodeClient,
    job_id: str,
    generation: int,
    sig: signal.Signals = signal.SIGTERM,
    grace_s: float = 5.0,
    record_exit_code: int | None = None,
) -> int | None:
    """Stop every process of the job's generation (by its mark, setsid or not, and the process groups they
    lead); returns the exit code now recorded (None if it never started)."""
    record = record_exit_code if record_exit_code is not None else 128 + int(sig)
    command = shell.kill_command(job_id, generation, sig, grace_s, record)
    # A job in the node's container: its processes are signalled from inside too (a root-owned container's
    # cannot be from outside), then from here, where the wrapper and the runtime's exec client live.
    inside = container.kill_inside(
        container.container_name(client.node), command, shell.job_mark(job_id, generation)
    )
    rc, out, err = client.exec(f"( {inside} ) >/dev/null 2>&1\n{command}", timeout=2 * grace_s + 300)
    if rc != 0:
        raise RemoteError(
            f"could not kill job {job_id} on node rank {client.node.rank}: {err.decode(errors='replace').strip()}"
        )
    words = out.decode().split()
    return int(words[1]) if len(words) == 2 and words[1].lstrip("-").isdigit() else None


def xcom_path(job_id: str, name: str = "return.json") -> str:
    """Where a job's $AIRFLOW_SKY_XCOM_DIR/<name> is on its node, relative to the home."""
    return f"{JOBS_DIR}/{shell.validate_job_id(job_id)}/xcom/{name}"


def read_xcom(
    client: NodeClient, job_id: str, name: str = "return.json", max_bytes: int = MAX_SMALL_FILE_BYTES
) -> bytes | None:
    """The file a job wrote to $AIRFLOW_SKY_XCOM_DIR/<name>, or None (FileTooLarge above `max_bytes`,
    UnsafeRemoteFile when it is a symlink, FIFO or device)."""
    return client.read_file(xcom_path(job_id, name), max_bytes=max_bytes)
