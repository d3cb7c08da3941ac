"""The client's local records (clusters.json, the ssh host entries and the user's ssh config) under
concurrent writers and crashes: real files, real processes, OpenSSH's own reading of the config."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_sky.client import cluster_index, record_files, ssh_config
from airflow_sky.client.cluster_search import AmbiguousCluster, locate
from airflow_sky.infra.base import Node
from airflow_sky.infra.home import HOME_ENV, SSH_CONFIG_ENV
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV

WRITERS = 6
ENTRIES_EACH = 15
_SPAWN = multiprocessing.get_context("spawn")  # children import only what they need; no forked threads


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sky home and a user's ssh config of the test's own (children inherit them through the env)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "sky-home"))
    monkeypatch.setenv(SSH_CONFIG_ENV, str(tmp_path / "dot-ssh" / "config"))
    monkeypatch.setenv(POOL_FILE_ENV, str(tmp_path / "no-pools.yaml"))  # no ssh pool is configured
    return tmp_path / "sky-home"


def _wait_for(start: Path) -> None:
    deadline = time.monotonic() + 120
    while not start.exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def _record_clusters(writer: int, start: str) -> None:
    _wait_for(Path(start))  # all writers go at once
    for i in range(ENTRIES_EACH):
        cluster_index.remember(f"w{writer}-c{i}", "aws" if i % 2 else "gcp/us-central1")
        if i % 3 == 0:
            cluster_index.remember(f"w{writer}-c{i}", None)  # a down between the launches


def _run_all(target: Callable[..., None], args: list[tuple[object, ...]], start: Path) -> None:
    children = [_SPAWN.Process(target=target, args=a) for a in args]
    for child in children:
        child.start()
    start.touch()
    for child in children:
        child.join(300)
    assert [c.exitcode for c in children] == [0] * len(children)


def test_concurrent_launches_recording_clusters_lose_no_entry(home: Path, tmp_path: Path) -> None:
    cluster_index.remember("kept-before", "local")
    start = tmp_path / "go"
    _run_all(_record_clusters, [(w, str(start)) for w in range(WRITERS)], start)
    expected = {"kept-before": "local"} | {
        f"w{w}-c{i}": "aws" if i % 2 else "gcp/us-central1"
        for w in range(WRITERS)
        for i in range(ENTRIES_EACH)
        if i % 3 != 0
    }
    assert json.loads((home / "clusters.json").read_text()) == expected
    assert stat.S_IMODE((home / "clusters.json").stat().st_mode) == 0o600
    assert [p.name for p in home.iterdir() if p.name.endswith(".tmp")] == []


def _die_before_replace(name: str) -> None:
    def killed(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies after its temp file, before the replace

    record_files.os.replace = killed  # type: ignore[assignment]
    cluster_index.remember(name, "aws")


def test_a_writer_killed_between_its_temp_file_and_the_replace_leaves_the_index_intact(home: Path) -> None:
    cluster_index.remember("alive", "aws")
    child = _SPAWN.Process(target=_die_before_replace, args=("doomed",))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    leftovers = [p for p in home.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and "doomed" in leftovers[0].read_text()  # written in full, never renamed
    assert cluster_index.read_index() == {"alive": "aws"}
    # The lock died with the writer; the next writer takes it, keeps every entry and clears the leftover.
    cluster_index.remember("next", "gcp")
    assert cluster_index.read_index() == {"alive": "aws", "next": "gcp"}
    assert [p for p in home.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize(
    "content",
    [b'{"alive": "aws", "half', b"", b'["not", "a", "mapping"]', b'{"x": 3}', b"\xff\xfe{}"],
    ids=["cut-short", "empty", "a-list", "a-number", "not-utf8"],
)
def test_an_unreadable_index_is_set_aside_with_one_line_and_the_next_write_starts_afresh(
    home: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    home.mkdir(parents=True)
    (home / "clusters.json").write_bytes(content)
    assert cluster_index.read_index() == {}
    err = capsys.readouterr().err
    assert (
        len(err.splitlines()) == 1 and "clusters.json" in err and "kept as clusters.json.unreadable-" in err
    )
    (backup,) = home.glob("clusters.json.unreadable-*")
    assert backup.read_bytes() == content  # kept for the user, byte for byte
    cluster_index.remember("fresh", "aws")
    assert cluster_index.read_index() == {"fresh": "aws"}
    assert capsys.readouterr().err == ""  # reported once


def test_down_with_a_cut_short_index_says_one_line_names_the_infras_searched_and_drops_stale_entries(
    home: Path,
) -> None:
    ssh_config.write_entries("ghost", [_node(0, 2200)], {0: "/keys/ghost"})  # left by a crashed launch
    (home / "clusters.json").write_text('{"ghost": "aw')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    env["AIRFLOW_SKY_AIRFLOW_HOME"] = str(home / "airflow")
    down = subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "down", "ghost", "-y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert down.returncode == 1, down.stdout + down.stderr
    assert "Traceback" not in down.stderr
    warning, error = down.stderr.strip().splitlines()
    assert "clusters.json: not valid JSON" in warning and "kept as clusters.json.unreadable-" in warning
    assert error.startswith("airflow-sky: error: cluster 'ghost' not found (searched: local)")
    assert "aws (no Airflow connection 'aws_default')" in error
    assert sorted((home / "ssh").glob("ghost.*")) == []  # gone everywhere: its ssh entries too


def test_a_cluster_the_index_knows_is_opened_without_asking_any_infra(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sky.client import cluster_search, sdk

    def no_search(infra: str, cluster_name: str) -> bool:  # a stand-in that fails the test if asked
        raise AssertionError(f"{infra} asked about {cluster_name}")

    monkeypatch.setattr(cluster_search, "has_cluster", no_search)
    cluster_index.remember("known", "aws/us-east-1")
    assert sdk.cluster_of("known").infra == "aws/us-east-1"
    # Not in the index: the infras are asked, local first, and the answer is recorded again.
    asked: list[str] = []

    def on_gcp_only(infra: str, cluster_name: str) -> bool:
        asked.append(infra)
        return infra == "gcp"

    monkeypatch.setattr(cluster_search, "has_cluster", on_gcp_only)
    assert locate("lost") == "gcp"
    assert asked[0] == "local" and set(asked) == {"local", "aws", "gcp"}
    assert cluster_index.infra_hint("lost") == "gcp"
    monkeypatch.setattr(cluster_search, "has_cluster", lambda infra, name: infra in ("aws", "gcp"))
    with pytest.raises(
        AmbiguousCluster, match=r"exists on aws and gcp.*airflow-sky status --infra aws twice"
    ):
        locate("twice")


def _node(rank: int, port: int) -> Node:
    return Node(rank, f"10.0.0.{rank + 1}", "127.0.0.1", port, "me", f"i-{rank}", host_key="ssh-ed25519 AAAA")


def _write_and_remove_entries(writer: int, start: str) -> None:
    _wait_for(Path(start))
    for i in range(ENTRIES_EACH):
        name = f"w{writer}-c{i}"
        nodes = [_node(0, 2200 + writer), _node(1, 2300 + writer)]
        ssh_config.write_entries(name, nodes, {0: f"/keys/{name}", 1: f"/keys/{name}"})
        if i % 3 == 0:
            ssh_config.remove_entries(name)


def test_concurrent_writers_keep_one_include_line_the_users_config_and_whole_entries(
    home: Path, tmp_path: Path
) -> None:
    # The user's config is a symlink into a dotfiles folder, mode 0640, with entries of their own.
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "ssh_config"
    real.write_text("Host mybox\n  HostName 192.0.2.7\n  User alice\n")
    real.chmod(0o640)
    link = Path(os.environ[SSH_CONFIG_ENV])
    link.parent.mkdir()
    link.symlink_to(real)
    start = tmp_path / "go"
    _run_all(_write_and_remove_entries, [(w, str(start)) for w in range(WRITERS)], start)

    assert link.is_symlink() and link.resolve() == real
    text = real.read_text()
    include = ssh_config.include_line(home / "ssh")
    assert text.count(include) == 1 and text.splitlines()[1] == include
    assert text.endswith("Host mybox\n  HostName 192.0.2.7\n  User alice\n")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    kept = {f"w{w}-c{i}" for w in range(WRITERS) for i in range(ENTRIES_EACH) if i % 3 != 0}
    entries = home / "ssh"
    assert {p.name.removesuffix(".config") for p in entries.glob("*.config")} == kept
    assert {p.name.removesuffix(".known_hosts") for p in entries.glob("*.known_hosts")} == kept
    assert [p.name for p in entries.iterdir() if p.name.endswith(".tmp")] == []
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in entries.glob("w*"))
    # OpenSSH itself reads the config through the Include: each alias resolves to its own node.
    for alias, port, key in (("w2-c4", 2202, "/keys/w2-c4"), ("w5-c14-worker1", 2305, "/keys/w5-c14")):
        resolved = subprocess.run(
            ["ssh", "-G", "-F", str(link), alias], capture_output=True, text=True, timeout=60, check=True
        ).stdout.splitlines()
        assert f"port {port}" in resolved and f"identityfile {key}" in resolved
        assert f"userknownhostsfile {entries / alias.split('-worker')[0]}.known_hosts" in resolved
    mine = subprocess.run(
        ["ssh", "-G", "-F", str(link), "mybox"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert "hostname 192.0.2.7" in mine and "user alice" in mine
