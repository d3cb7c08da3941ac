"""What one cluster's job leaves on an ssh pool host never runs in the next cluster's, on real OpenSSH servers.

A job runs as the host's login user: it can write every file sshd, bash, python, git and PATH consult for
the next cluster. Here cluster A's job (a command run as that user over SSH, the same user, home and rights)
plants them all, each writing to a spy directory outside the home when it runs; after A's teardown, cluster
B takes the same host (a pool of one), and B's job runs its commands, python, a login shell and a git
checkout with a secret in its env: no planted code runs, A's own key no longer opens the host, and the
login files are what they were before A (the baseline, kept on the state host).
"""

from __future__ import annotations

import os
import pwd
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import paramiko
import psutil
import pytest

from airflow_sky.infra.base import Node, ProvisionRequest
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.infra.ssh.login_baseline import BASELINES_ROOT
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import read_job, start_job
from tests.ssh.conftest import POOL
from tests.ssh.sshd import PORT, SshdPool

POOL_SIZE = 1  # every cluster gets the same host
SUBNET = 1
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"  # the hosts' python3 is this machine's


@pytest.fixture
def spy(sshd_pool: SshdPool) -> Iterator[Path]:
    """A directory outside the host's home that planted code writes to when it runs (anyone may write)."""
    path = sshd_pool.root / f"spy-{secrets.token_hex(4)}"
    path.mkdir(mode=0o1777)
    path.chmod(0o1777)
    yield path


@pytest.fixture
def cloud(sshd_pool: SshdPool) -> Iterator[SshCloud]:
    driver = SshCloud(POOL)
    try:
        yield driver
    finally:
        for cluster in driver.clusters():  # what a failed test left held
            driver.terminate(cluster)


def _as_job(cloud: SshCloud, cluster: str, node: Node, script: str) -> str:
    """Run `script` on `node` as the user its jobs run as (what a job's script can do)."""
    with NodeClient(node, cloud.key_file_for(cluster, node)) as client:
        rc, out, err = client.exec(script, timeout=60)
    assert rc == 0, (out + err).decode(errors="replace")
    return out.decode()


def _run_job(cloud: SshCloud, cluster: str, node: Node, script: str, env: dict[str, str]) -> None:
    with NodeClient(node, cloud.key_file_for(cluster, node)) as client:
        assert start_job(client, "1-run", script, env).started
        deadline = time.monotonic() + 120
        while (state := read_job(client, "1-run", 0, 0)).exit_code is None:
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.1)
        assert state.exit_code == 0, state


def _plant_everything(spy: Path, attacker_key: str) -> str:
    """Shell text: every file of the next cluster's login that runs code, each writing `spy/<what>`."""

    def hook(what: str) -> str:
        return f'echo "$$ {what}" >> {spy}/ran-{what}; env >> {spy}/env-{what} 2>/dev/null'

    site = f"~/.local/lib/{PY}/site-packages"
    return f"""
set -e
cat >> ~/.bashrc <<'EOF'
{hook("bashrc")}
EOF
for f in .profile .bash_profile .bash_login; do printf '%s\\n' '{hook("profile")}' >> ~/$f; done
printf '%s\\n' '{hook("ssh_rc")}' > ~/.ssh/rc
echo {attacker_key!r} >> ~/.ssh/authorized_keys
mkdir -p {site} ~/hooks ~/bin
cat > {site}/usercustomize.py <<'EOF'
import os; os.system({hook("usercustomize")!r})
EOF
cat > {site}/zz.pth <<'EOF'
import os; os.system({hook("pth")!r})
EOF
printf '[core]\\n\\thooksPath = %s/hooks\\n' "$HOME" > ~/.gitconfig
printf '#!/bin/sh\\n%s\\n' '{hook("git_hook")}' > ~/hooks/post-checkout
printf '#!/bin/sh\\n%s\\nexec /usr/bin/python3 "$@"\\n' '{hook("path_python")}' > ~/bin/python3
chmod +x ~/hooks/post-checkout ~/bin/python3
mkdir -p ~/.cache/pip ~/sky_workdir && echo poisoned > ~/.cache/pip/wheel && echo left > ~/sky_workdir/x
echo left > ~/results.txt
"""


# What B's job does: python (the site hooks, a PATH python3), a login shell (~/.profile), a git checkout
# (hooks), and whatever sshd runs for its commands (~/.bashrc, ~/.ssh/rc).
B_JOB = """
python3 -c 'print("b python")'
bash -lc 'echo b login shell'
git init -q repo && cd repo && git -c user.email=b@b -c user.name=b commit -q --allow-empty -m one
git checkout -q -b other
"""


def test_a_clusters_planted_login_files_key_and_site_hooks_never_run_in_the_next_clusters_job(
    cloud: SshCloud, sshd_pool: SshdPool, spy: Path, tmp_path: Path
) -> None:
    host = sshd_pool.hosts[0]
    original = "# the admin's own bashrc\nexport FROM_BASELINE=1\n"
    bashrc = host.home / ".bashrc"
    bashrc.write_text(original)
    bashrc.chmod(0o640)
    os.chown(bashrc, pwd.getpwnam(host.user).pw_uid, -1)
    _forget_baseline(sshd_pool)
    attacker_key = tmp_path / "attacker"
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(attacker_key))
    public = key.export_public_key().decode().strip()

    (a,) = cloud.provision(ProvisionRequest("team-a", 1))
    _as_job(cloud, "team-a", a, _plant_everything(spy, public))
    assert _key_opens(host.address, host.user, attacker_key)  # the planted key works while A holds the host
    _run_job(cloud, "team-a", a, "python3 -c 1", {})
    assert sorted(p.name for p in spy.glob("ran-*")), "the planted files did not run inside team A's own job"
    for planted in spy.iterdir():
        planted.unlink()

    cloud.terminate("team-a")
    assert not _key_opens(host.address, host.user, attacker_key), (
        "A's key still opens the host after teardown"
    )
    assert (host.home / "results.txt").exists(), "teardown removed what the job left for its owner to read"

    (b,) = cloud.provision(ProvisionRequest("team-b", 1))
    assert b.ssh_user == host.user
    secret = f"b-secret-{secrets.token_hex(8)}"
    _run_job(cloud, "team-b", b, B_JOB, {"B_SECRET": secret})
    ran = sorted(p.name for p in spy.iterdir())
    assert ran == [], f"planted code ran in team B's job: {ran}"
    assert bashrc.read_text() == original and (bashrc.stat().st_mode & 0o777) == 0o640
    home = sorted(p.name for p in host.home.iterdir())
    for gone in (
        ".local",
        ".gitconfig",
        "hooks",
        "bin",
        ".profile",
        ".bash_profile",
        ".cache",
        "results.txt",
    ):
        assert gone not in home, f"~/{gone} outlived the handover: {home}"
    assert not (host.home / ".ssh" / "rc").exists()
    assert public.split()[1] not in (host.home / ".ssh" / "authorized_keys").read_text()
    assert not _key_opens(host.address, host.user, attacker_key)
    cloud.terminate("team-b")


@pytest.mark.parametrize(
    "first_line", ["exit 0", 'kill -9 "$PPID"; exit 0'], ids=["exit-at-the-top", "kill-the-session"]
)
def test_a_bashrc_that_ends_every_command_cannot_stop_the_teardown_sweep_or_the_reset(
    cloud: SshCloud, sshd_pool: SshdPool, spy: Path, first_line: str
) -> None:
    host = sshd_pool.hosts[0]
    tag = f"{1000 + secrets.randbelow(8000)}.{secrets.randbelow(10**6)}"
    (a,) = cloud.provision(ProvisionRequest("breaker", 1))
    # A leftover that the sweep must end, then a ~/.bashrc that ends (or kills) every shell sshd starts:
    # the sweep runs through that shell. The bashrc goes last: it ends this command's own shell too.
    _as_job(
        cloud,
        "breaker",
        a,
        f"setsid sleep {tag} < /dev/null > /dev/null 2>&1 & "
        f"printf '%s\\n' 'echo \"$$ $BASH_EXECUTION_STRING\" >> {spy}/ran-bashrc' {first_line!r} > ~/.bashrc",
    )
    assert _sleeps(tag), "the leftover did not start"
    cloud.terminate("breaker")
    deadline = time.monotonic() + 30
    while _sleeps(tag):
        assert time.monotonic() < deadline, "the leftover outlived teardown"
        time.sleep(0.05)
    assert sshd_pool.locked_hosts() == []
    assert "ran-bashrc" not in (host.home / ".bashrc").read_text()  # the baseline's again
    assert list(spy.iterdir()) == [], "the planted ~/.bashrc ran during the reset"
    (b,) = cloud.provision(ProvisionRequest("after", 1))
    _run_job(cloud, "after", b, "echo fine", {"B_SECRET": "s"})
    assert list(spy.iterdir()) == []
    cloud.terminate("after")


def _sleeps(tag: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if (p.info["cmdline"] or [])[-1:] == [tag] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _key_opens(address: str, user: str, key_file: Path) -> bool:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the key under test is the user's
    try:
        client.connect(
            address,
            PORT,
            user,
            key_filename=str(key_file),
            look_for_keys=False,
            allow_agent=False,
            timeout=30,
        )
        return True
    except paramiko.AuthenticationException:
        return False
    finally:
        client.close()


def _forget_baseline(pool: SshdPool) -> None:
    """The admin changed the host's login files: its next allocation takes a new baseline."""
    for record in (pool.state.home / BASELINES_ROOT).glob("*.json"):
        record.unlink()
