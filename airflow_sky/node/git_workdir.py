"""Git workdirs (`workdir: {url, ref}`): the commit a job pins, and its checkout in ~/sky_workdir on a node.

SkyPilot's conventions for private repositories: `GIT_TOKEN` (a secret, or an env, which SkyPilot treats
as a secret too) authenticates HTTP(S) URLs; `GIT_SSH_KEY_PATH`, a private key file on the machine that
launches (here: the Airflow worker that runs the task), authenticates SSH URLs, else the node's own ssh
config and default keys do.

The token and the key never reach a command line (a process list), a log, an XCom or a file left behind:
they travel over the SSH channel's stdin and reach git through the environment of its process, read by a
credential helper whose text names only the variable (the key: a 0600 temp file removed on exit).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from airflow_sky.errors import RemoteError, SpecError
from airflow_sky.node.paths import WORKDIR
from airflow_sky.task import GitWorkdir
from airflow_sky.task.redaction import GIT_TOKEN, redactor

# The CLI checks a git workdir before its engine has configured Airflow, which node.client would load.
if TYPE_CHECKING:
    from airflow_sky.node.client import NodeClient

GIT_SSH_KEY_PATH = "GIT_SSH_KEY_PATH"
# The user name sent with a token: GitHub takes it for any token, GitLab and Gitea for personal tokens. A user
# in the URL (https://oauth2@gitlab.example.com/...) is sent instead.
DEFAULT_TOKEN_USER = "x-access-token"
TOKEN_VAR = "AIRFLOW_SKY_GIT_TOKEN"  # the git process's env var that holds the token
USER_VAR = "AIRFLOW_SKY_GIT_USER"
# A credential helper that prints the env vars (git runs it as `sh -c '<helper> "$@"' get`): its text carries
# no secret, so it may sit on a command line. Answering only `get` keeps `store`/`erase` from doing anything.
_HELPER = (
    f'!f() {{ test "$1" = get || return 0; echo "username=${USER_VAR}"; echo "password=${TOKEN_VAR}"; }}; f'
)
FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?[^:/]+:")  # user@host:path, SkyPilot's SCP-like SSH form

# A checkout's whole time limit (NodeClient.exec stops it then): a large first clone over a slow link fits
# well inside it.
CHECKOUT_TIMEOUT_S = 1800.0
_LOCK_WAIT_S = 900  # two checkouts on one node (a retried sync beside a late first) take turns

UrlKind = Literal["http", "ssh", "other"]

# Exit codes of the checkout script: each one a failure the Python side names (no grepping of stderr).
_EXIT_NO_GIT = 3
_EXIT_NOT_REPLACEABLE = 4
_EXIT_FETCH = 5
_EXIT_NO_COMMIT = 6
_EXIT_CHECKOUT = 7
_EXIT_LOCK = 8


@dataclasses.dataclass(frozen=True)
class GitAuth:
    """How git reaches a repository: a token for HTTP(S) URLs, a key file (on this machine) for SSH URLs."""

    token: str | None = dataclasses.field(default=None, repr=False)  # never in a repr that may be logged
    user: str = DEFAULT_TOKEN_USER
    ssh_key_path: str | None = None

    @property
    def secrets(self) -> list[str]:
        return [self.token] if self.token else []


@dataclasses.dataclass(frozen=True)
class CheckoutResult:
    commit: str  # the full sha the node's ~/sky_workdir now has checked out
    state: str  # "cloned" (a new clone), "fetched" (a kept clone fetched it), "present" (it had it)


# ---- pure parts -----------------------------------------------------------------------------------------


def url_kind(url: str) -> UrlKind:
    """`http` for http(s):// URLs (GIT_TOKEN applies), `ssh` for ssh:// and user@host:path, else `other`."""
    lowered = url.lower()
    if lowered.startswith(("https://", "http://")):
        return "http"
    if lowered.startswith("ssh://") or ("://" not in url and _SCP_LIKE.match(url)):
        return "ssh"
    return "other"


def check_url(url: str) -> str:
    """The URL, refused when git would read it as an option or it is empty."""
    if not url.strip():
        raise SpecError("workdir.url: must be a git URL (https://host/owner/repo or git@host:owner/repo)")
    if url.startswith("-"):
        raise SpecError(f"workdir.url: must not start with '-' (git would read it as an option), got {url!r}")
    return url


def auth_for(git: GitWorkdir, secrets: Mapping[str, str]) -> GitAuth:
    """The credentials `secrets` (the task's envs and secrets) give for `git.url`, by SkyPilot's rules."""
    kind = url_kind(git.url)
    token = (secrets.get(GIT_TOKEN) or None) if kind == "http" else None
    user = _url_user(git.url) or DEFAULT_TOKEN_USER
    key = (secrets.get(GIT_SSH_KEY_PATH) or None) if kind == "ssh" else None
    return GitAuth(token=token, user=user, ssh_key_path=os.path.expanduser(key) if key else None)


def _url_user(url: str) -> str | None:
    match = re.match(r"^https?://([^@/]+)@", url, re.IGNORECASE)
    return match.group(1).partition(":")[0] if match else None


def credential_args(with_token: bool) -> list[str]:
    """git's `-c` options that make the token the only credential: the helpers the machine has configured
    are reset first, so none of them answers instead or stores the token."""
    return ["-c", "credential.helper=", "-c", f"credential.helper={_HELPER}"] if with_token else []


def ssh_command(key_file: str | None) -> str:
    """GIT_SSH_COMMAND: never prompts; trusts a new host key on first contact (a fresh node knows none);
    with a key file, only that key."""
    words = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
    if key_file is not None:
        words += ["-i", key_file, "-o", "IdentitiesOnly=yes"]
    return shlex.join(words)


def ref_label(git: GitWorkdir) -> str:
    return git.ref if git.ref is not None else "HEAD"


def checkout_command(
    url: str,
    commit: str,
    *,
    token_user: str | None = None,
    ssh_key: bool = False,
    ssh_url: bool = False,
) -> str:
    """Bash that makes ~/sky_workdir a clone of `url` with `commit` checked out (detached); prints the sha
    now checked out and how it got there (`cloned`, `fetched`, `present`).

    stdin carries the secrets: the token's line (with `token_user`), then the SSH key (with `ssh_key`). A
    directory that is no clone of `url` (a synced workdir, another repository) is replaced; a kept clone
    is reused and fetched. The shallow fetch by sha falls back to fetching every branch and tag (dumb HTTP
    servers and servers that refuse fetching an unadvertised sha).
    """
    lines = [
        "set -u",
        "umask 077",
        "export GIT_TERMINAL_PROMPT=0",
        'fail() { echo "$2" >&2; exit "$1"; }',
        f"command -v git >/dev/null 2>&1 || fail {_EXIT_NO_GIT} 'git is not installed'",
    ]
    git = "git"
    if token_user is not None:
        lines += [
            f"IFS= read -r {TOKEN_VAR} || true",
            f"export {TOKEN_VAR} {USER_VAR}={shlex.quote(token_user)}",
        ]
        git = shlex.join(["git", *credential_args(True)])
    if ssh_key:
        # The key file goes when the script does (a trapped signal exits through the EXIT trap too).
        lines += [
            'key=""',
            'trap \'[ -z "$key" ] || rm -f "$key"\' EXIT',
            "trap 'exit 129' HUP INT TERM",
            f"key=$(mktemp) && cat > \"$key\" || fail {_EXIT_FETCH} 'cannot write the SSH key to a temp file'",
            # (git runs GIT_SSH_COMMAND through a shell: the path is quoted for it)
            'export GIT_SSH_COMMAND="ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new '
            '-i $(printf %q "$key") -o IdentitiesOnly=yes"',
        ]
    elif ssh_url:
        lines.append(f"export GIT_SSH_COMMAND={shlex.quote(ssh_command(None))}")
    lines += [
        f"url={shlex.quote(url)}",
        f"commit={shlex.quote(commit)}",
        f'dir="$HOME"/{WORKDIR}',
        'mkdir -p "$HOME/.airflow_sky"',
        "if command -v flock >/dev/null 2>&1; then",
        '  exec 9>"$HOME/.airflow_sky/git-workdir.lock"',
        f"  flock -w {_LOCK_WAIT_S} 9 || fail {_EXIT_LOCK} 'another checkout of ~/{WORKDIR} holds its lock'",
        "fi",
        'if [ -d "$dir/.git" ] && [ "$(git -C "$dir" config --get remote.origin.url)" = "$url" ]; then',
        "  state=fetched",
        "else",
        # --one-file-system: a bucket mounted below the old directory is never emptied through it.
        f'  rm -rf --one-file-system "$dir" || fail {_EXIT_NOT_REPLACEABLE} "$dir is not a clone of $url '
        'and cannot be removed"',
        f'  git init -q "$dir" && git -C "$dir" remote add origin "$url" || fail {_EXIT_FETCH} '
        '"cannot create a git repository in $dir"',
        "  state=cloned",
        "fi",
        'cd "$dir" || exit 1',
        'if git rev-parse -q --verify "$commit^{commit}" >/dev/null; then',
        '  [ "$state" = cloned ] || state=present',
        f'elif ! {git} fetch -q --depth 1 origin "$commit" 2>/dev/null; then',
        '  if [ "$(git rev-parse --is-shallow-repository)" = true ]; then deepen=--unshallow; else deepen=; fi',
        # (git's own message is the last line of stderr: the caller reports it)
        f"  {git} fetch -q $deepen --tags origin '+refs/heads/*:refs/remotes/origin/*' || exit {_EXIT_FETCH}",
        "fi",
        f'full=$(git rev-parse -q --verify "$commit^{{commit}}") || fail {_EXIT_NO_COMMIT} '
        '"$url has no commit $commit"',
        f'git -c advice.detachedHead=false checkout -q --force --detach "$full" || fail {_EXIT_CHECKOUT} '
        '"cannot check out $full"',
        'echo "$(git rev-parse HEAD) $state"',
    ]
    return "\n".join(lines) + "\n"


def stdin_payload(token: str | None, ssh_key: bytes | None) -> bytes:
    """What `checkout_command` reads from stdin: the token's line, then the key."""
    return (f"{token}\n".encode() if token is not None else b"") + (ssh_key or b"")


def parse_checkout_output(out: bytes, commit: str) -> CheckoutResult | None:
    """The script's last line -> (sha, state), when the sha is the commit asked for (or abbreviates to it)."""
    words = out.decode(errors="replace").strip().rpartition("\n")[2].split()
    if len(words) != 2 or not FULL_COMMIT.match(words[0]) or not words[0].startswith(commit.lower()):
        return None
    return CheckoutResult(commit=words[0], state=words[1])


def auth_hint(url: str, auth: GitAuth) -> str:
    kind = url_kind(url)
    if kind == "http" and auth.token is not None:
        return f"; check that {GIT_TOKEN} is a token that can read this repository"
    if kind == "http":
        return f"; a private repository needs a token: give it as the secret {GIT_TOKEN}"
    if kind == "ssh" and auth.ssh_key_path is None:
        return f"; a private repository needs an SSH key: set {GIT_SSH_KEY_PATH} to its file"
    return ""


def last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ---- on a node: the checkout -----------------------------------------------------------------------------


def checkout(
    client: NodeClient,
    git: GitWorkdir,
    commit: str,
    secrets: Mapping[str, str],
    log: Callable[[str], None],
) -> str:
    """Make the node's ~/sky_workdir a clone of `git.url` with `commit` checked out; returns its full sha.

    `secrets` are the task's envs and secrets (GIT_TOKEN, GIT_SSH_KEY_PATH); a key file is read here and
    sent to the node over stdin with the token. Raises RemoteError naming workdir.url and the rank.
    """
    url = check_url(git.url)
    auth = auth_for(git, secrets)
    key = _read_key(auth.ssh_key_path) if auth.ssh_key_path is not None else None
    command = checkout_command(
        url,
        commit,
        token_user=auth.user if auth.token is not None else None,
        ssh_key=key is not None,
        ssh_url=url_kind(url) == "ssh",
    )
    rc, out, err = client.exec(command, stdin=stdin_payload(auth.token, key), timeout=CHECKOUT_TIMEOUT_S)
    rank = client.node.rank
    result = parse_checkout_output(out, commit) if rc == 0 else None
    if result is None:
        raise RemoteError(
            _checkout_failure(git, commit, rank, rc, redactor(auth.secrets)(last_line(err)), auth)
        )
    how = {"cloned": "new clone", "fetched": "kept clone, fetched", "present": "kept clone"}.get(result.state)
    log(
        f"cloned {url} at {ref_label(git)} ({result.commit}) -> ~/{WORKDIR} on rank {rank}"
        + (f" ({how})" if how else "")
    )
    return result.commit


def _read_key(path: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError as e:
        raise SpecError(
            f"{GIT_SSH_KEY_PATH}: cannot read the key file {path} on this machine (the one that runs the "
            f"job's Airflow tasks): {e.strerror or e}"
        ) from e


def _checkout_failure(git: GitWorkdir, commit: str, rank: int, rc: int, detail: str, auth: GitAuth) -> str:
    """One line: what failed where, the script's (or git's) own last words, and the fix where one is known."""
    where = f"workdir.url: checking out {git.url} at {ref_label(git)} ({commit}) on node rank {rank} failed"
    fixes = {
        _EXIT_NO_GIT: "; install git in the node's image",
        _EXIT_FETCH: auth_hint(git.url, auth),
        _EXIT_NO_COMMIT: " (was the ref force-pushed or the commit deleted since the job pinned it?)",
    }
    return f"{where}: {detail or f'exit code {rc}'}{fixes.get(rc, '')}"
