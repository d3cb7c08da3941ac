"""The worker's `git ls-remote` of a workdir URL (which a run's conf may name) uses nothing of the worker's
own: a private repository that only the worker's credentials open fails cleanly, and the worker's git
config (url.insteadOf, credential helpers) and ~/.netrc are not read. Against a real git HTTP server
(tests/gitserver.py) behind a token.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.node import git_commit as gc
from airflow_sky.task import GitWorkdir
from tests.gitserver import GitServer, serve_repo

TOKEN = "worker-own-token-5b1e"


@pytest.fixture
def private_repo(tmp_path: Path):
    with serve_repo(tmp_path / "private", token=TOKEN) as server:
        server.commit({"train.py": "print(1)\n"})
        yield server


@pytest.fixture
def worker_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_repo: GitServer) -> Path:
    """A worker whose home opens the private repository three ways: a credential store, ~/.netrc and an
    http.extraHeader, and rewrites https://example.invalid/ to it; GIT_CONFIG_GLOBAL names that config."""
    home = tmp_path / "worker-home"
    home.mkdir()
    host = private_repo.url.split("/")[2]
    (home / ".git-credentials").write_text(f"http://x-access-token:{TOKEN}@{host}\n")
    (home / ".netrc").write_text(f"machine 127.0.0.1 login x-access-token password {TOKEN}\n")
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    config = home / ".gitconfig"
    config.write_text(
        "[credential]\n\thelper = store\n"
        f'[http]\n\textraHeader = "Authorization: Basic {basic}"\n'
        f'[url "{private_repo.url}"]\n\tinsteadOf = https://example.invalid/team/repo.git\n'
    )
    monkeypatch.delenv(gc.USERS_MACHINE_ENV, raising=False)  # an Airflow worker (a CLI test may have set it)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")  # a config given by env vars, as a deployment may
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "credential.helper")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "store")
    return home


def test_a_private_url_that_only_the_workers_credentials_open_fails_cleanly(
    private_repo: GitServer, worker_home: Path
) -> None:
    with pytest.raises(SpecError) as refused:
        gc.resolve_commit(GitWorkdir(private_repo.url), {})
    message = str(refused.value)
    assert message.startswith(f"workdir.url: cannot read {private_repo.url}: ")
    assert "a private repository needs a token: give it as the secret GIT_TOKEN" in message
    assert TOKEN not in message
    assert private_repo.seen and not any(authorized for _, authorized in private_repo.seen), (
        "a request reached the repository with the worker's credentials"
    )


def test_the_workers_url_rewrite_is_not_applied_to_a_workdir_url(
    private_repo: GitServer, worker_home: Path
) -> None:
    with pytest.raises(SpecError, match=r"^workdir.url: cannot read https://example.invalid/team/repo.git"):
        gc.resolve_commit(GitWorkdir("https://example.invalid/team/repo.git"), {})
    assert private_repo.seen == [], "the worker's url.insteadOf sent the URL to another repository"


def test_the_tasks_own_token_still_opens_it(private_repo: GitServer, worker_home: Path) -> None:
    head = private_repo.commit({"train.py": "print(2)\n"})
    assert gc.resolve_commit(GitWorkdir(private_repo.url), {"GIT_TOKEN": TOKEN}) == head
    assert not (worker_home / ".git-credentials").read_text().count("\n") > 1, "the token was stored"


def test_on_the_users_own_machine_their_git_setup_opens_it(
    private_repo: GitServer, worker_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI and the SDK run for the user on their machine: as `sky launch`, their credential helper and
    url rewrites apply there (an Airflow worker never marks itself so)."""
    monkeypatch.setenv(gc.USERS_MACHINE_ENV, "1")
    head = private_repo.commit({"train.py": "print(3)\n"})
    assert gc.resolve_commit(GitWorkdir("https://example.invalid/team/repo.git"), {}) == head


def test_the_cli_marks_its_process_as_the_users_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sky.client.engine import bind_private_home

    monkeypatch.delenv(gc.USERS_MACHINE_ENV, raising=False)
    bind_private_home()
    assert os.environ.get(gc.USERS_MACHINE_ENV) == "1"


def test_the_ssh_command_uses_no_config_agent_default_key_or_known_hosts_of_the_worker(
    tmp_path: Path,
) -> None:
    known = str(tmp_path / "known_hosts")
    anonymous = gc.isolated_ssh_command(known, None)
    for option in (
        "-F /dev/null",
        "IdentityAgent=none",
        "IdentityFile=none",
        "IdentitiesOnly=yes",
        f"UserKnownHostsFile={known}",
        "BatchMode=yes",
    ):
        assert option in anonymous
    keyed = gc.isolated_ssh_command(known, "/keys/deploy key")
    assert "-i '/keys/deploy key'" in keyed and "IdentityFile=none" not in keyed
    env = gc.isolated_env(str(tmp_path), "git@example.com:o/r.git", None, None, "u")
    assert env["HOME"] == str(tmp_path) and env["GIT_CONFIG_NOSYSTEM"] == "1"
    assert not any(name.startswith("SSH_") and name != "SSH_ASKPASS" for name in env)
