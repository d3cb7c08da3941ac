"""A pool host changes hands clean: the login user's files go back to their baseline, nothing of theirs runs.

Jobs run as the pool's login user, so a job can write what sshd, bash, python, git and pip read for the
*next* cluster on the host: ~/.bashrc (Debian's bash sources it for every command sshd runs, the next job's
start with its env and secrets on stdin included), ~/.profile, ~/.ssh/rc, ~/.ssh/authorized_keys (a key of
its own), ~/.gitconfig hooks, ~/.local (user site-packages before the system's, `usercustomize`, `.pth`),
~/bin on PATH, pip's config, ~/.cache (pip wheels, model files). So:

- at a host's first allocation its *baseline* is taken: content and mode of every login file and tree below
  (and which are absent), and the names at the top of the home; it is kept on the pool's state host, which
  no job can write (HostBaselines);
- whenever the host changes hands (teardown frees it, an allocation takes it) `reset` runs: the login files
  are put back over SFTP (the internal-sftp subsystem runs no shell and no ~/.ssh/rc, so a planted ~/.bashrc
  cannot stop it), then the user's processes are swept over a shell (its ~/.bashrc is the baseline's by
  then), then the files are put back again and the user's processes are listed over SFTP (/proc): anything
  left of the user but this session fails the reset (a live job that keeps re-planting a file wins the race
  with the shell: the host then stays held, never handed on). Only then, with nothing of the user running,
  job areas are removed (~/sky_workdir, ~/.airflow_sky, ~/.cache, the user's files in /tmp, /var/tmp and
  /dev/shm) and, when a cluster takes the host, every name at the top of the home the baseline lacks.

Not covered (docs/infra-ssh.md): a login user of root (every process is root's); a host whose sshd runs an
external sftp-server (through the login shell: `Subsystem sftp internal-sftp` is needed) or reads
authorized_keys from the home (a job can force a command on the pool's key: keep the keys root-owned);
directories present at the baseline outside the login set (a tool tree in the home is shared by every
cluster); jobs of one cluster, which share the user and trust each other.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import posixpath
import secrets
import shlex
import stat
from collections.abc import Iterator, Sequence
from typing import Any

import paramiko

from airflow_sky.errors import ClusterError, RemoteError
from airflow_sky.infra.ssh.hosts import clean_command, remove_containers
from airflow_sky.infra.ssh.state_store import SshStateStore
from airflow_sky.node.client import NodeClient
from airflow_sky.node.paths import WORKDIR

# What sshd, the login shells, python, git and pip read from the home, kept exactly (content and mode).
LOGIN_FILES = (
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".bash_logout", ".bash_aliases", ".inputrc",
    ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".zlogout", ".pam_environment", ".gitconfig",
    ".netrc", ".curlrc", ".wgetrc", ".pydistutils.cfg", ".npmrc", ".condarc", ".Rprofile",
)  # fmt: skip
LOGIN_TREES = (".ssh", ".config", ".local", "bin", ".pip", ".docker", ".ipython", ".jupyter", ".gnupg")
# Emptied at every reset whatever the baseline holds: what jobs write (records, workdir, caches).
CLEARED = (WORKDIR, ".airflow_sky", ".cache")
TRASH = ".airflow-sky-reset"  # where the reset moves what it removes over SFTP, until the shell deletes it
MAX_BYTES = 4 * 1024 * 1024  # a baseline's file contents, in all
MAX_ENTRIES = 2000
ATTEMPTS = 3  # restore, sweep, restore, check rounds before a reset gives up
BASELINES_ROOT = ".airflow_sky/host-baselines"  # on the state host


@dataclasses.dataclass(frozen=True)
class Entry:
    """One path of the login set as the baseline has it: `kind` f(ile), d(irectory) or l(ink)."""

    path: str  # relative to the home
    kind: str
    mode: int
    data: str = ""  # a file's content (base64) or a link's target


@dataclasses.dataclass(frozen=True)
class Baseline:
    home_mode: int
    top: tuple[str, ...]  # the names at the top of the home (CLEARED and TRASH aside)
    entries: tuple[Entry, ...]  # the login files and trees present, parents before children

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Baseline:
        return cls(
            int(data["home_mode"]),
            tuple(str(n) for n in data["top"]),
            tuple(
                Entry(str(e["path"]), str(e["kind"]), int(e["mode"]), str(e["data"])) for e in data["entries"]
            ),
        )


class HostBaselines:
    """The baselines of a state host's pool hosts, one record per host (keyed as its host lock)."""

    def __init__(self, store: SshStateStore) -> None:
        self._store = store

    def get(self, key: str) -> Baseline | None:
        record = self._store.get(key)
        return Baseline.from_dict(record.data) if record is not None and record.data else None

    def get_or_take(self, key: str, client: NodeClient, label: str) -> Baseline:
        """The host's baseline; taken from the host now (and kept) when it has none yet."""
        found = self.get(key)
        if found is not None:
            return found
        baseline = take(client, label)
        if self._store.put(key, baseline.to_dict(), None) is None:  # another worker took it first
            return self.get(key) or baseline
        return baseline


# ---- over SFTP (no shell runs) -----------------------------------------------------------------------------


def _walk(sftp: paramiko.SFTPClient, path: str, attrs: paramiko.SFTPAttributes) -> Iterator[tuple[str, Any]]:
    """`path` and everything under it, parents first (links are not followed)."""
    yield path, attrs
    if stat.S_ISDIR(attrs.st_mode or 0):
        for child in sorted(sftp.listdir_attr(path), key=lambda a: a.filename):
            yield from _walk(sftp, f"{path}/{child.filename}", child)


def _kind(mode: int) -> str:
    return "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else "f" if stat.S_ISREG(mode) else "?"


def _login_set(sftp: paramiko.SFTPClient) -> dict[str, Any]:
    """Path -> attributes of every login file and tree entry the home holds now."""
    found: dict[str, Any] = {}
    for attrs in sftp.listdir_attr("."):
        if attrs.filename in LOGIN_FILES or attrs.filename in LOGIN_TREES:
            for path, a in _walk(sftp, attrs.filename, attrs):
                found[path] = a
    return found


def take(client: NodeClient, label: str) -> Baseline:
    """The host's login files and top-level names as they are now."""
    entries: list[Entry] = []
    total = 0
    with client._sftp_call(f"baseline of {label}") as sftp:
        home_mode = stat.S_IMODE(sftp.stat(".").st_mode or 0o700)
        top = tuple(sorted(n for n in sftp.listdir(".") if n not in CLEARED and n != TRASH))
        for path, attrs in _login_set(sftp).items():
            kind, mode = _kind(attrs.st_mode or 0), stat.S_IMODE(attrs.st_mode or 0)
            data = ""
            if kind == "f":
                total += attrs.st_size or 0
                if total > MAX_BYTES:
                    raise ClusterError(_too_big(label, path))
                with sftp.open(path, "rb") as f:
                    data = base64.b64encode(f.read()).decode()
            elif kind == "l":
                data = sftp.readlink(path) or ""
            elif kind == "?":
                continue  # a socket or fifo (gpg-agent's): nothing runs it, nothing restores it
            entries.append(Entry(path, kind, mode, data))
            if len(entries) > MAX_ENTRIES:
                raise ClusterError(_too_big(label, path))
    return Baseline(home_mode, top, tuple(entries))


def _too_big(label: str, path: str) -> str:
    return (
        f"host {label}: ~/{path}: the login user's files that sshd, the shells, python, git and pip read "
        f"hold more than {MAX_ENTRIES} entries or {MAX_BYTES // 1024 // 1024} MiB, too much to keep as the "
        "host's baseline (restored between clusters); move them out of the home (tools installed system-"
        "wide), or give the pool a dedicated login user with a bare home"
    )


def restore(client: NodeClient, baseline: Baseline, label: str, strict: bool) -> list[str]:
    """Put the login set back as the baseline has it; what is not in it moves to TRASH. Returns the paths
    it changed. Errors are skipped unless `strict` (a live job may move files under the first pass)."""
    changed: list[str] = []
    wanted = {e.path: e for e in baseline.entries}
    with client._sftp_call(f"reset of {label}") as sftp:
        with contextlib.suppress(OSError):
            sftp.mkdir(TRASH, 0o700)
        trash = f"{TRASH}/{secrets.token_hex(6)}"
        sftp.mkdir(trash, 0o700)
        for step in (_remove_extras, _put_back):
            try:
                changed += step(sftp, wanted, trash)
            except OSError:
                if strict:
                    raise
        if stat.S_IMODE(sftp.stat(".").st_mode or 0) != baseline.home_mode:
            sftp.chmod(".", baseline.home_mode)
            changed.append("~")
    return changed


def _remove_extras(sftp: paramiko.SFTPClient, wanted: dict[str, Entry], trash: str) -> list[str]:
    moved: list[str] = []
    for path, attrs in _login_set(sftp).items():
        entry = wanted.get(path)
        parent = posixpath.dirname(path)
        if (entry is None or entry.kind != _kind(attrs.st_mode or 0)) and (not parent or parent in wanted):
            sftp.posix_rename(path, f"{trash}/{len(moved)}")  # one rename, whatever the tree holds
            moved.append(path)
    return moved


def _put_back(sftp: paramiko.SFTPClient, wanted: dict[str, Entry], trash: str) -> list[str]:
    current = _login_set(sftp)
    put = []
    for entry in wanted.values():  # parents first
        attrs = current.get(entry.path)
        if entry.kind == "d":
            if attrs is None:
                sftp.mkdir(entry.path, entry.mode)
            if attrs is None or stat.S_IMODE(attrs.st_mode or 0) != entry.mode:
                sftp.chmod(entry.path, entry.mode)
                put.append(entry.path)
            continue
        if attrs is not None and _same(sftp, entry, attrs):
            continue
        tmp = f"{trash}/new-{len(put)}"
        if entry.kind == "l":
            sftp.symlink(entry.data, tmp)
        else:
            with sftp.open(tmp, "wxb") as f:  # a new file: never through a link a job left
                f.write(base64.b64decode(entry.data))
            sftp.chmod(tmp, entry.mode)
        sftp.posix_rename(tmp, entry.path)  # replaces the entry itself, a link is not followed
        put.append(entry.path)
    return put


def _same(sftp: paramiko.SFTPClient, entry: Entry, attrs: paramiko.SFTPAttributes) -> bool:
    if _kind(attrs.st_mode or 0) != entry.kind:
        return False
    if entry.kind == "l":
        return sftp.readlink(entry.path) == entry.data
    data = base64.b64decode(entry.data)
    if stat.S_IMODE(attrs.st_mode or 0) != entry.mode or attrs.st_size != len(data):
        return False
    with sftp.open(entry.path, "rb") as f:
        return bool(f.read(len(data) + 1) == data)


def leftover_processes(client: NodeClient, label: str) -> list[str]:
    """`pid comm` of each live process of the login user but this SFTP session (and the sshd session
    serving it), read from /proc over SFTP: no shell, nothing of the user's answers. Empty for root."""
    with client._sftp_call(f"process list of {label}") as sftp:
        me = sftp.normalize("/proc/self").rpartition("/")[2]
        uid = sftp.stat(f"/proc/{me}").st_uid
        if uid == 0:
            return []
        ours = {me}
        pid = me
        while (fields := _stat_fields(sftp, pid)) is not None and fields[2] not in ours:
            parent = fields[2]
            if sftp.stat(f"/proc/{parent}").st_uid != uid:
                break
            ours.add(pid := parent)
        found = []
        for attrs in sftp.listdir_attr("/proc"):
            if attrs.filename.isdigit() and attrs.st_uid == uid and attrs.filename not in ours:
                fields = _stat_fields(sftp, attrs.filename)
                if fields is not None and fields[1] != "Z":
                    found.append(f"{attrs.filename} {fields[0]}")
        return found


def _stat_fields(sftp: paramiko.SFTPClient, pid: str) -> tuple[str, str, str] | None:
    """(comm, state, ppid) of a process; None when it is gone."""
    try:
        with sftp.open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:
        return None
    comm = text[text.find("(") + 1 : text.rfind(")")]
    state, ppid = text[text.rfind(")") + 2 :].split()[:2]
    return comm, state, ppid


# ---- the whole reset ---------------------------------------------------------------------------------------


def clear_command(remove: tuple[str, ...]) -> str:
    """Shell text, run once nothing of the user is left: job records and areas, what the reset moved aside,
    `remove` (top-level names the baseline lacks), and the user's files in the shared temp dirs."""
    names = " ".join(shlex.quote(n) for n in (*CLEARED, TRASH, *remove))
    return f"""\
cd "$HOME" && rm -rf -- {names}
find /tmp /var/tmp /dev/shm -mindepth 1 -maxdepth 1 -user "$(id -u)" -exec rm -rf -- {{}} + 2>/dev/null
true
"""


def reset(
    client: NodeClient, baseline: Baseline, label: str, taking: bool, containers: Sequence[str] = ()
) -> str | None:
    """Put the host back to its baseline, with nothing of its login user running; None when done, else why
    not (the caller keeps the host from the next cluster). `taking`: a cluster takes the host now, so names
    at the top of the home the baseline lacks go too (teardown leaves them, for whoever reads results).
    The user's node containers (`containers`: the allocation's, and any other a node left) are removed by
    their runtime before the sweep, with the login files (the runtime's config among them) back already."""
    why = ""
    for _ in range(ATTEMPTS):
        try:
            restore(client, baseline, label, strict=False)
            remove_containers(client, containers)
            # A login file that slipped back in between may end this shell, its session or its output:
            # nothing it prints is believed, and the check below reads /proc over SFTP.
            with contextlib.suppress(RemoteError):
                client.exec(clean_command(spare_sessions=False), timeout=120, purpose="the host's reset")
            restore(client, baseline, label, strict=True)
            left = leftover_processes(client, label)
        except (RemoteError, OSError, paramiko.SSHException, EOFError) as e:
            client.reset()  # a broken or killed session: the next round opens a new one
            why = f"its login files could not be reset: {e}"
            continue
        if not left:
            break
        why = f"processes of its user outlived the reset: {', '.join(left[:5])}"
    else:
        return why
    try:
        remove: tuple[str, ...] = ()
        if taking:
            top = set(client.listdir(".") or [])
            remove = tuple(sorted(top - set(baseline.top) - set(CLEARED) - {TRASH}))
        client.exec(clear_command(remove), timeout=300, purpose="the host's reset")
    except RemoteError as e:
        return f"its job areas could not be removed: {e}"
    return None
