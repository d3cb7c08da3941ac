"""Workdir and file-mount upload to a node: rsync over SSH where both ends have it, SFTP otherwise.

Exclusions follow SkyPilot: a `.skyignore` at the top of the directory, else the `.gitignore` files in it.
Re-syncs send only what changed (rsync's quick check; the SFTP path compares size and mtime the same way).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pathspec

from airflow_sky.errors import RemoteError
from airflow_sky.node.client import NodeClient, host_key_mismatch_message
from airflow_sky.node.paths import remote_path

SKYIGNORE = ".skyignore"
GITIGNORE = ".gitignore"


@dataclasses.dataclass(frozen=True)
class SyncResult:
    method: str  # "rsync" or "sftp"
    files_sent: tuple[str, ...]  # paths relative to the source directory


def ignore_spec(local_dir: Path) -> pathspec.PathSpec:
    """The exclusion rules of a directory: .skyignore wins over .gitignore files (as in SkyPilot)."""
    skyignore = local_dir / SKYIGNORE
    if skyignore.is_file():
        return pathspec.GitIgnoreSpec.from_lines(skyignore.read_text().splitlines())
    lines: list[str] = []
    for gitignore in sorted(local_dir.rglob(GITIGNORE)):
        prefix = gitignore.parent.relative_to(local_dir).as_posix()
        for raw in gitignore.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            lines.append(_anchor(line, prefix))
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _anchor(pattern: str, prefix: str) -> str:
    """Re-root a nested .gitignore's pattern at the top directory (git scopes it to its own folder)."""
    if prefix in ("", "."):
        return pattern
    negate = pattern.startswith("!")
    body = pattern[1:] if negate else pattern
    anchored = body.lstrip("/") if "/" in body.rstrip("/") else f"**/{body}"
    return ("!" if negate else "") + f"{prefix}/{anchored}"


def iter_files(local_dir: Path, spec: pathspec.PathSpec) -> Iterator[str]:
    """Relative paths of the files to send, in a stable order, skipping ignored files and directories."""
    for root, dirs, files in os.walk(local_dir):
        rel_root = Path(root).relative_to(local_dir).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = sorted(d for d in dirs if not spec.match_file(rel_root + d + "/"))
        for name in sorted(files):
            rel = rel_root + name
            if not spec.match_file(rel):
                yield rel


def local_rsync() -> bool:
    """This machine has rsync and the OpenSSH client that carries it."""
    return shutil.which("rsync") is not None and shutil.which("ssh") is not None


class NoRemoteRsync(RemoteError):
    """The node has no rsync (its shell could not find the command)."""


def _not_found(command: str, stderr: str) -> bool:
    """The node's login shell said it cannot find `command` (bash, dash, zsh, tcsh and fish wordings)."""
    name = re.escape(command)
    return (
        re.search(
            rf"(^|[\s:]){name}: (command )?not found|command not found: {name}\b|unknown command:? '?{name}\b",
            stderr,
            re.IGNORECASE | re.MULTILINE,
        )
        is not None
    )


def sync_dir(
    client: NodeClient,
    local_dir: str | Path,
    remote_dir: str,
    method: str = "auto",
    on_progress: Callable[[str], None] | None = None,
) -> SyncResult:
    """Upload the contents of `local_dir` into `remote_dir` (relative to the node's home, or `~/...`)."""
    source = Path(local_dir).expanduser()
    if not source.is_dir():
        raise RemoteError(f"cannot sync {source}: not a directory")
    remote_dir = remote_path(remote_dir)
    if method == "auto":
        # rsync is tried straight away rather than asked about first: a node without it fails the rsync at
        # once (its shell cannot find the command), and the SFTP path takes over. Asking first would cost
        # every sync a second SSH connection and a shell on the node.
        if local_rsync() and client.remote_has_rsync is not False:
            try:
                return _rsync(client, source, remote_dir, on_progress)
            except NoRemoteRsync:
                client.remote_has_rsync = False
        method = "sftp"
    if method == "rsync":
        return _rsync(client, source, remote_dir, on_progress)
    if method == "sftp":
        return _sftp_sync(client, source, remote_dir, on_progress)
    raise ValueError(f"unknown sync method {method!r}: use 'auto', 'rsync' or 'sftp'")


def ssh_command_for(client: NodeClient, known_hosts: Path) -> list[str]:
    """The OpenSSH client command that reaches the node with the cluster key and the pinned host key.

    `known_hosts` (holding only the pinned key) is the one file ssh checks: neither the user's nor the
    system's known_hosts is read, so a stale line there for a recycled address changes nothing, and any
    other key is refused.
    """
    node = client.node
    return [
        "ssh",
        "-i",
        client.key_file,
        "-p",
        str(node.ssh_port),
        "-l",
        node.ssh_user,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=10",
        # A node that stops answering ends the transfer: 4 unanswered keepalives 15 s apart.
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
    ]


def known_hosts_line(client: NodeClient) -> str:
    """The known_hosts line OpenSSH (under rsync) checks the node's host key against."""
    line = client.node.known_hosts_line
    if line is None:
        raise RemoteError(f"node rank {client.node.rank} has no pinned host key; cannot rsync to it safely")
    return line + "\n"


def files_to_send(source: Path) -> list[str]:
    """The one file list both transports send: every file under `source` that the ignore rules keep."""
    return select_files(source).files


@dataclasses.dataclass(frozen=True)
class FileSelection:
    files: list[str]  # relative to the source directory, in a stable order
    # Recursing over the directory sends exactly `files`: no ignore rule applies and nothing in it is a
    # symlink (the list skips symlinked directories). rsync may then walk the tree itself, which is much
    # cheaper than reading a list of every file (about 0.1 s per 5,000 files on a re-sync).
    whole_tree: bool


def select_files(source: Path) -> FileSelection:
    """What to send from `source`, and whether a plain recursion would send exactly that."""
    spec = ignore_spec(source)
    if spec.patterns:
        return FileSelection(list(iter_files(source, spec)), whole_tree=False)
    files: list[str] = []
    whole_tree = True

    def walk(directory: str, prefix: str) -> None:
        # scandir's entries know their type from the directory itself: no stat per file (5,000 files cost
        # a few ms, which matters when several syncs share a process).
        nonlocal whole_tree
        with os.scandir(directory) as entries:
            ordered = sorted(entries, key=lambda e: e.name)
        subdirs = []
        for entry in ordered:
            if entry.is_symlink():
                whole_tree = False
                if entry.is_dir():
                    continue  # as os.walk: a symlinked directory is not entered, and not a file
                files.append(prefix + entry.name)
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(entry)
            else:
                files.append(prefix + entry.name)
        for entry in subdirs:
            walk(entry.path, prefix + entry.name + "/")

    walk(os.fspath(source), "")
    return FileSelection(files, whole_tree)


RSYNC_IO_TIMEOUT_S = 120
_HOST_KEY_REFUSED = "Host key verification failed"  # what OpenSSH prints for a key other than the pinned one
REMOTE_RSYNC = "rsync"  # the command the node's shell runs (tests name a missing one)


def _rsync(
    client: NodeClient, source: Path, remote_dir: str, on_progress: Callable[[str], None] | None
) -> SyncResult:
    with tempfile.TemporaryDirectory(prefix="airflow-sky-sync-") as tmp:
        known_hosts = Path(tmp) / "known_hosts"
        known_hosts.write_text(known_hosts_line(client))
        # rsync is handed our file list (NUL-separated: names may hold newlines) instead of its own filter
        # rules, so it sends exactly what the SFTP path would; where recursing sends the same files, it
        # recurses (empty directories pruned: the list has none).
        selection = select_files(source)
        if selection.whole_tree:
            selected = ["--prune-empty-dirs"]
        else:
            file_list = Path(tmp) / "files"
            file_list.write_bytes(b"".join(os.fsencode(rel) + b"\0" for rel in selection.files))
            selected = ["--from0", f"--files-from={file_list}"]
        command = [
            "rsync",
            "-rlptz" if _over_network(client.node.ssh_host) else "-rlpt",
            "--out-format=%i %n",
            f"--timeout={RSYNC_IO_TIMEOUT_S}",  # no data moving for this long fails the sync
            "-e",
            shlex.join(ssh_command_for(client, known_hosts)),
            f"--rsync-path=mkdir -p {shlex.quote(remote_dir)} && {REMOTE_RSYNC}",
            *selected,
            f"{source}/",
            f"{client.node.ssh_host}:{remote_dir}/",
        ]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode in (30, 35, 255) and "timeout" in proc.stderr.lower():
        raise RemoteError(
            f"rsync of {source} to node rank {client.node.rank} ({client.node.ssh_host}): no data moved "
            f"for {RSYNC_IO_TIMEOUT_S}s: the node stopped answering"
        )
    if proc.returncode != 0 and _HOST_KEY_REFUSED in proc.stderr:
        raise RemoteError(host_key_mismatch_message(client.node))
    if proc.returncode != 0:
        error = NoRemoteRsync if _not_found(REMOTE_RSYNC, proc.stderr) else RemoteError
        raise error(
            f"rsync of {source} to node rank {client.node.rank} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    client.remote_has_rsync = True
    sent = []
    for line in proc.stdout.splitlines():
        flags, _, name = line.partition(" ")
        # `<f` = a file was transferred; directories and attribute-only updates are not sends.
        if flags.startswith("<f"):
            sent.append(name)
            if on_progress:
                on_progress(name)
    return SyncResult("rsync", tuple(sent))


def _over_network(host: str) -> bool:
    """Whether the bytes to `host` cross a network, where compressing them pays (SkyPilot's rsync uses -z).
    A node on this machine's loopback (the local infra) is not: compression only burns CPU there."""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume the network
        return host != "localhost"


def _sftp_sync(
    client: NodeClient, source: Path, remote_dir: str, on_progress: Callable[[str], None] | None
) -> SyncResult:
    sftp = client.sftp
    client.exec(f"mkdir -p {shlex.quote(remote_dir)}", timeout=60)
    made_dirs: set[str] = {""}
    sent = []
    for rel in files_to_send(source):
        local = source / rel
        local_stat = local.stat()
        remote = f"{remote_dir}/{rel}"
        parent = os.path.dirname(rel)
        if parent not in made_dirs:
            client.exec(f"mkdir -p {shlex.quote(remote_dir + '/' + parent)}", timeout=60)
            made_dirs.update(_parents(parent))
        try:
            remote_stat = sftp.stat(remote)
            unchanged = remote_stat.st_size == local_stat.st_size and int(remote_stat.st_mtime or 0) == int(
                local_stat.st_mtime
            )
        except FileNotFoundError:
            unchanged = False
        if unchanged:
            continue
        sftp.put(str(local), remote)
        sftp.utime(remote, (int(local_stat.st_atime), int(local_stat.st_mtime)))
        sftp.chmod(remote, stat.S_IMODE(local_stat.st_mode))
        sent.append(rel)
        if on_progress:
            on_progress(rel)
    return SyncResult("sftp", tuple(sent))


def _parents(rel_dir: str) -> set[str]:
    parts = rel_dir.split("/")
    return {"/".join(parts[: i + 1]) for i in range(len(parts))}
