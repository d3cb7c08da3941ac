"""The commit a git workdir pins: its ref resolved once by `git ls-remote` on the machine that launches (the
Airflow worker), so every node, and a recovery's replacement, checks out the same commit while the branch
moves; and checkout_task_workdir, a task's workdir checked out at that commit (the checkout on the nodes
is node.git_workdir).

The URL may come from a run's conf (a user who may only trigger the DAG), so `git ls-remote` runs here
with nothing of the worker's own: no system or global git config (no `url.insteadOf`, no credential
helper, no transport a config allows beyond git's defaults), an empty home (no ~/.netrc or
~/.git-credentials), no prompt; for an ssh URL no ssh config, agent, default key or known_hosts of
the worker (a fresh empty one: the host key is taken on first contact, as a fresh node does). Only what
the task names reaches the repository: GIT_TOKEN, or GIT_SSH_KEY_PATH, which the DAG author (trusted)
names and a managed run's conf may not (task.conf_policy); with it, that key alone.

The CLI and the SDK resolve on the user's own machine, for the user's own task: there, as `sky launch`
does, the user's git and ssh setup (agent, keys, known_hosts, credential helpers) is used. They say so by
setting AIRFLOW_SKY_GIT_USERS_MACHINE=1 in their process (`use_machine_git_setup`), which their engine's
child processes inherit; an Airflow worker never sets it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from airflow_sky.errors import SkyError, SpecError
from airflow_sky.node.git_workdir import (
    FULL_COMMIT,
    GIT_SSH_KEY_PATH,
    TOKEN_VAR,
    USER_VAR,
    auth_for,
    auth_hint,
    check_url,
    checkout,
    credential_args,
    last_line,
    ssh_command,
    url_kind,
)
from airflow_sky.task import GitWorkdir, Task
from airflow_sky.task.redaction import redactor

# The CLI resolves a commit before its engine has configured Airflow, which node.client would load.
if TYPE_CHECKING:
    from airflow_sky.node.client import NodeClient

_HEX_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}$")
LS_REMOTE_TIMEOUT_S = 120.0
USERS_MACHINE_ENV = "AIRFLOW_SKY_GIT_USERS_MACHINE"


def use_machine_git_setup() -> None:
    """Called by the CLI and the SDK (client/): this process runs on the user's own machine, whose git and
    ssh setup may open the user's repositories. Never called on an Airflow worker."""
    os.environ[USERS_MACHINE_ENV] = "1"


def _on_users_machine() -> bool:
    return os.environ.get(USERS_MACHINE_ENV) == "1"


def parse_ls_remote(text: str) -> dict[str, str]:
    """`git ls-remote` output -> {ref name: sha}."""
    refs: dict[str, str] = {}
    for line in text.splitlines():
        sha, _, name = line.partition("\t")
        if name and FULL_COMMIT.match(sha.strip()):
            refs[name.strip()] = sha.strip()
    return refs


def pick_commit(refs: Mapping[str, str], ref: str | None) -> str | None:
    """The commit `ref` names among the remote's refs: the remote HEAD for None; a full ref name, a branch,
    then a tag (an annotated tag: the commit it points at); a hex string (7-40) as the commit it abbreviates
    at a ref's tip, else as given (each node fetches it the same way). None: no such ref."""
    if ref is None:
        return refs.get("HEAD")
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
        if name in refs and (name == "HEAD" or name.startswith("refs/")):
            return refs.get(f"{name}^{{}}", refs[name])
    if _HEX_COMMIT.match(ref):
        lowered = ref.lower()
        tips = {sha for sha in refs.values() if sha.startswith(lowered)}
        return tips.pop() if len(tips) == 1 else lowered
    return None


def resolve_commit(git: GitWorkdir, secrets: Mapping[str, str]) -> str:
    """The commit `git.ref` names now (None: the remote's HEAD), by `git ls-remote` on this machine.

    A job pins it once, so every node (and a recovery's replacement) checks out the same commit even when
    the branch moves meanwhile. Raises SpecError naming workdir.url or workdir.ref (never with the token).
    """
    url = check_url(git.url)
    auth = auth_for(git, secrets)
    key = _readable_key(auth.ssh_key_path) if url_kind(url) == "ssh" else None
    redact = redactor(auth.secrets)
    try:
        with tempfile.TemporaryDirectory(prefix="airflow-sky-git-") as home:
            env = (
                users_env(url, key, auth.token, auth.user)
                if _on_users_machine()
                else isolated_env(home, url, key, auth.token, auth.user)
            )
            proc = subprocess.run(
                ["git", *credential_args(auth.token is not None), "ls-remote", "--", url],
                env=env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=LS_REMOTE_TIMEOUT_S,
                check=False,
            )
    except FileNotFoundError as e:
        raise SkyError(
            "workdir: git is not installed on this machine, which resolves the workdir's ref to a commit "
            "before the nodes clone it; install git (apt-get install git)"
        ) from e
    except subprocess.TimeoutExpired as e:
        raise SkyError(
            f"workdir.url: git ls-remote {url} did not answer in {LS_REMOTE_TIMEOUT_S:.0f}s; check that "
            "this machine can reach the repository"
        ) from e
    if proc.returncode != 0:
        reason = redact(last_line(proc.stderr)) or f"git ls-remote exited with {proc.returncode}"
        raise SpecError(f"workdir.url: cannot read {url}: {reason}{auth_hint(url, auth)}")
    refs = parse_ls_remote(proc.stdout.decode(errors="replace"))
    commit = pick_commit(refs, git.ref)
    if commit is None:
        raise SpecError(_unknown_ref_message(git, refs))
    return commit


def users_env(url: str, key_file: str | None, token: str | None, user: str) -> dict[str, str]:
    """The environment of `git ls-remote` on the user's own machine (CLI, SDK): theirs, without a prompt; a
    GIT_SSH_KEY_PATH key alone when given, else their ssh config, agent and keys, as `sky launch`."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    if token is not None:
        env |= {TOKEN_VAR: token, USER_VAR: user}
    if url_kind(url) == "ssh":
        env["GIT_SSH_COMMAND"] = ssh_command(key_file)
    return env


def isolated_env(home: str, url: str, key_file: str | None, token: str | None, user: str) -> dict[str, str]:
    """The environment of the worker's `git ls-remote`: this process's, without a git or ssh variable of its
    own (GIT_CONFIG_*, GIT_SSH_COMMAND, SSH_AUTH_SOCK, ...), with `home` (an empty temp directory) as HOME
    and XDG_CONFIG_HOME, no system or global git config (so git's own transport rules: ext:: never), no prompt."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GIT_", "SSH_")) and name not in ("HOME", "XDG_CONFIG_HOME")
    }
    env |= {
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "true",  # answers nothing: git asks no one for a password
        "SSH_ASKPASS": "true",
    }
    if token is not None:
        env |= {TOKEN_VAR: token, USER_VAR: user}
    if url_kind(url) == "ssh":
        env["GIT_SSH_COMMAND"] = isolated_ssh_command(os.path.join(home, "known_hosts"), key_file)
    return env


def isolated_ssh_command(known_hosts: str, key_file: str | None) -> str:
    """GIT_SSH_COMMAND for the worker: no ssh config file, agent, default key, GSSAPI ticket or shared
    connection of the worker's; `known_hosts` (a fresh file) takes the host key on first contact; with
    `key_file`, that key alone."""
    words = ["ssh", "-F", os.devnull, *_ssh_options(known_hosts)]
    words += ["-i", key_file] if key_file is not None else ["-o", "IdentityFile=none"]
    return shlex.join(words)


def _ssh_options(known_hosts: str) -> list[str]:
    options = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "accept-new",
        "UserKnownHostsFile": known_hosts,
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "GSSAPIAuthentication": "no",
        "HostbasedAuthentication": "no",
        "ControlMaster": "no",
        "ControlPath": "none",
    }
    return [word for name, value in options.items() for word in ("-o", f"{name}={value}")]


def _readable_key(path: str | None) -> str | None:
    if path is not None and not os.path.isfile(path):
        raise SpecError(
            f"{GIT_SSH_KEY_PATH}: no key file {path} on this machine (the one that runs the job's Airflow "
            "tasks); give the path of a private key there, or leave it unset for a public repository (this "
            "machine's own ssh config, agent and keys are never used for a workdir's URL)"
        )
    return path


def _unknown_ref_message(git: GitWorkdir, refs: Mapping[str, str]) -> str:
    if git.ref is None:
        return (
            f"workdir.url: {git.url} has no HEAD (an empty repository?); name a branch or tag in workdir.ref"
        )
    branches = sorted(name.removeprefix("refs/heads/") for name in refs if name.startswith("refs/heads/"))
    shown = ", ".join(branches[:10]) + (", ..." if len(branches) > 10 else "")
    return (
        f"workdir.ref: {git.ref!r} is no branch or tag of {git.url}, nor a commit sha (7-40 hex digits)"
        + (f"; its branches: {shown}" if branches else "")
    )


def checkout_task_workdir(
    client: NodeClient, task: Task, commit: str | None, log: Callable[[str], None]
) -> str | None:
    """The task's git workdir checked out on the node at `commit` (the job's pinned one; None: resolved
    here); returns the sha, or None (doing nothing) when the workdir is no git workdir."""
    if not isinstance(task.workdir, GitWorkdir):
        return None
    secrets = task.envs_and_secrets
    pinned = commit if commit is not None else resolve_commit(task.workdir, secrets)
    return checkout(client, task.workdir, pinned, secrets, log)
