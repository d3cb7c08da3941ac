"""The worker's `git ls-remote` of an ssh workdir URL (which a run's conf may name) uses none of the worker's
ssh identity: against a real OpenSSH server whose user authorizes a key the worker holds in its ssh-agent
and names in its GIT_SSH_COMMAND, the URL fails cleanly without GIT_SSH_KEY_PATH, opens with it (the
DAG author's explicit key), and the worker's known_hosts is never written.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.node import git_commit as gc
from airflow_sky.task import GitWorkdir
from tests.gitserver import git
from tests.ssh.sshd import PORT, SshdPool, _chown_tree

POOL_SIZE = 1
SUBNET = 3


@pytest.fixture(scope="module")
def ssh_repo(sshd_pool: SshdPool, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(ssh URL, head commit) of a bare repository in the pool host's home."""
    host = sshd_pool.hosts[0]
    bare = host.home / "repo.git"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    work = tmp_path_factory.mktemp("work")
    git("init", "-q", "-b", "main", str(work))
    (work / "train.py").write_text("print(1)\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("push", "-q", str(bare), "main", cwd=work)
    _chown_tree(host.home, host.user)
    return f"ssh://{host.user}@{host.address}:{PORT}{bare}", git("rev-parse", "HEAD", cwd=work)


@pytest.fixture
def worker_with_key(sshd_pool: SshdPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The worker holds the authorized key in an ssh-agent and names it in its GIT_SSH_COMMAND."""
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd_pool.client_key)], env=env, check=True, timeout=30)
        monkeypatch.delenv(gc.USERS_MACHINE_ENV, raising=False)  # an Airflow worker, not the CLI
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv(
            "GIT_SSH_COMMAND", f"ssh -i {sshd_pool.client_key} -o StrictHostKeyChecking=no -o BatchMode=yes"
        )
        yield
    finally:
        agent.terminate()
        agent.wait(30)


def _known_hosts() -> bytes | None:
    path = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"  # where ssh looks (not $HOME)
    return path.read_bytes() if path.exists() else None


def test_an_ssh_url_gets_none_of_the_workers_keys_and_fails_cleanly(ssh_repo, worker_with_key) -> None:
    url, _ = ssh_repo
    before = _known_hosts()
    with pytest.raises(SpecError) as refused:
        gc.resolve_commit(GitWorkdir(url), {})
    message = str(refused.value)
    assert message.startswith(f"workdir.url: cannot read {url}: ")
    assert "a private repository needs an SSH key: set GIT_SSH_KEY_PATH" in message
    assert _known_hosts() == before, "the worker's known_hosts was written"


def test_the_dag_authors_explicit_key_opens_it(sshd_pool: SshdPool, ssh_repo, worker_with_key) -> None:
    url, head = ssh_repo
    before = _known_hosts()
    assert gc.resolve_commit(GitWorkdir(url), {"GIT_SSH_KEY_PATH": str(sshd_pool.client_key)}) == head
    assert _known_hosts() == before, "the worker's known_hosts was written"
