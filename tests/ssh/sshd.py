"""Real OpenSSH servers for the ssh-infra tests: one `sshd` per loopback address, one Unix user per host.

Each host has its own sshd process (own config, host key and pid file), its own user and home, so nodes do
not share `~/sky_workdir`. One more host, `state`, is the pools' state host: it runs no jobs. Needs root (useradd, sshd); `.ci/run` runs the tests as root and the bootstrap
installs openssh-server. Everything started is stopped by `SshdPool.stop()`: the servers, every process of
the test users, the users themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import asyncssh

SSHD = "/usr/sbin/sshd"
PORT = 2022


class SshdHost:
    def __init__(
        self, pool: SshdPool, index: int, user: str, address: str, home: Path, name: str | None = None
    ) -> None:
        self.pool = pool
        self.index = index
        self.user = user
        self.address = address
        self.home = home
        name = name or f"host{index}"
        self.dir = pool.root / name
        self.proc: subprocess.Popen[bytes] | None = None
        self.alias = f"{pool.prefix}-{name}"

    def public_host_key(self) -> str:
        key_type, blob = (self.dir / "host_key.pub").read_text().split()[:2]
        return f"{key_type} {blob}"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "host_key").exists():  # a restarted host keeps its identity
            key = asyncssh.generate_private_key("ssh-ed25519")
            key.write_private_key(str(self.dir / "host_key"))
            os.chmod(self.dir / "host_key", 0o600)
            key.write_public_key(str(self.dir / "host_key.pub"))
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address}:{PORT}",
                    f"HostKey {self.dir / 'host_key'}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the test homes sit under a temp dir; sshd's own hardening is not under test
                    "PermitUserEnvironment yes",  # ~/.ssh/environment sets PATH (a fake nvidia-smi on one host)
                    f"AllowUsers {self.user}",
                    "MaxStartups 100:30:200",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation dir
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "sshd.log", "ab"),  # noqa: SIM115 - handed to the child
        )
        _wait_listening(self.address, PORT, self.proc)

    def kill(self) -> None:
        """The machine dies: its sshd and every process of its user, at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        # The per-connection sshd monitors (root) too, so that no session of this host lives on.
        subprocess.run(["pkill", "-KILL", "-f", f"^sshd: {self.user}[ @]"], check=False)
        subprocess.run(["pkill", "-KILL", "-u", self.user], check=False)

    def restart(self) -> None:
        self.kill()
        self.start()

    def add_fake_gpus(self, name: str, count: int) -> None:
        """A fake `nvidia-smi` on this host's PATH: no GPU exists on a CI machine, so this stands in."""
        bin_dir = self.home / "bin"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "nvidia-smi"
        lines = "".join(f"echo '{name}, {count}'\n" for _ in range(count))
        script.write_text(f"#!/bin/bash\n{lines}")
        script.chmod(0o755)
        _chown_tree(bin_dir, self.user)


class SshdPool:
    """N hosts; `client_key` opens all of them; `ssh_config` maps each alias to its address and port."""

    def __init__(self, size: int, prefix: str, subnet: int) -> None:
        """`subnet` (0-3) keeps the addresses of two pools of one test worker apart."""
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or "0"
        self.prefix = prefix
        self.root = Path(tempfile.mkdtemp(prefix=f"sky-sshd-{prefix}-"))
        os.chmod(self.root, 0o755)
        self.client_key = self.root / "id_ed25519"
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(self.client_key))
        os.chmod(self.client_key, 0o600)
        key.write_public_key(str(self.client_key) + ".pub")
        third = 200 + int(worker) * 4 + subnet
        self.hosts = [
            SshdHost(self, i, f"sky{worker}{prefix[:6]}{i}", f"127.0.{third}.{i + 2}", self.root / f"home{i}")
            for i in range(size)
        ]
        # The pools' state host: its own user and address, no job runs there.
        state_address = f"127.0.{third}.{size + 2}"
        self.state = SshdHost(
            self, -1, f"sky{worker}{prefix[:6]}s", state_address, self.root / "home-state", "state"
        )
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"

    def start(self) -> SshdPool:
        try:
            for host in self.all_hosts:
                _create_user(host.user, host.home, Path(f"{self.client_key}.pub").read_text())
                host.start()
        except BaseException:
            self.stop()
            raise
        self.known_hosts.write_text(
            "".join(f"[{h.address}]:{PORT} {h.public_host_key()}\n" for h in self.all_hosts)
        )
        self.ssh_config.write_text(
            "".join(
                f"Host {h.alias}\n  HostName {h.address}\n  Port {PORT}\n  User {h.user}\n\n"
                for h in self.all_hosts
            )
        )
        return self

    @property
    def all_hosts(self) -> list[SshdHost]:
        """The job hosts and the state host."""
        return [*self.hosts, self.state]

    def state_records(self) -> Path:
        """Where the state host keeps the pools' records."""
        return self.state.home / ".airflow_sky" / "state"

    def locks(self) -> list[dict[str, object]]:
        """The host locks held on the state host (a released host's record is empty), as written."""
        records = sorted((self.state.home / ".airflow_sky" / "host-locks").glob("*.json"))
        return [data for path in records if (data := json.loads(path.read_text())["data"])]

    def locked_hosts(self) -> list[str]:
        """The addresses of the hosts a lock holds."""
        return [str(lock["host"]).rpartition("@")[2].rpartition(":")[0] for lock in self.locks()]

    def pool_yaml(self, name: str, hosts: list[SshdHost] | None = None) -> str:
        """The pool in SkyPilot's ssh_node_pools.yaml format: aliases from ssh_config, the shared key, and
        our `state` host."""
        entries = "".join(f"    - {h.alias}\n" for h in hosts or self.hosts)
        return (
            f"{name}:\n  identity_file: {self.client_key}\n  state:\n    host: {self.state.alias}\n"
            f"  hosts:\n{entries}"
        )

    def state_connection_field(self) -> dict[str, str]:
        """The connection form's `extra.state` (the port is the connection's)."""
        return {"host": self.state.address, "user": self.state.user}

    def stop(self) -> None:
        for host in self.all_hosts:
            with contextlib.suppress(Exception):
                host.kill()
        for host in self.all_hosts:
            subprocess.run(["userdel", "-f", host.user], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftover_processes(self) -> list[str]:
        """Processes of the hosts' users other than the sshd sessions of connections this process holds."""
        out = subprocess.run(
            ["pgrep", "-a", "-u", ",".join(h.user for h in self.all_hosts)], capture_output=True, text=True
        ).stdout
        # Zombies are dead already: where PID 1 does not reap (containers), killed sessions linger as them.
        return [
            line
            for line in out.splitlines()
            if line.strip() and " sshd: " not in line and not line.endswith("<defunct>")
        ]


def _create_user(user: str, home: Path, public_key: str) -> None:
    with contextlib.suppress(KeyError):
        pwd.getpwnam(user)
        subprocess.run(["pkill", "-KILL", "-u", user], check=False)
        subprocess.run(["userdel", "-f", user], check=False, capture_output=True)
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["useradd", "-M", "-p", "*", "-d", str(home), "-s", "/bin/bash", user],
        check=True,
        capture_output=True,
    )
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(public_key)
    (ssh_dir / "environment").write_text(f"PATH={home}/bin:/usr/local/bin:/usr/bin:/bin\n")
    _chown_tree(home, user)
    os.chmod(home, 0o700)


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")]:
        os.lchown(p, entry.pw_uid, entry.pw_gid)


def _wait_listening(address: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {address}:{port} exited with {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    raise RuntimeError(f"sshd on {address}:{port} did not listen within {timeout_s}s")
