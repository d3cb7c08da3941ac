"""Workdir sync to a real local node: ignore rules, incremental re-sync, rsync and SFTP paths."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_sky.node import sync
from airflow_sky.node.client import NodeClient
from airflow_sky.node.sync import ignore_spec, iter_files, sync_dir


def _make_tree(root: Path, count: int) -> None:
    for i in range(count):
        sub = root / f"pkg{i % 20}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"file{i}.py").write_text(f"value = {i}\n")


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_resync_after_one_change_sends_only_that_file(local_cluster, tmp_path, method):
    _, nodes, key = local_cluster(1)
    _make_tree(tmp_path, 2000)
    with NodeClient(nodes[0], key) as client:
        first = sync_dir(client, tmp_path, "~/sky_workdir", method=method)
        assert first.method == method and len(first.files_sent) == 2000
        changed = tmp_path / "pkg7" / "file7.py"
        changed.write_text("value = 'changed'\n")
        future = time.time() + 5  # a different mtime even on coarse clocks
        os.utime(changed, (future, future))
        second = sync_dir(client, tmp_path, "~/sky_workdir", method=method)
        assert second.files_sent == ("pkg7/file7.py",)
        assert client.exec("cat sky_workdir/pkg7/file7.py")[1] == b"value = 'changed'\n"
        assert client.exec("find sky_workdir -type f | wc -l")[1].strip() == b"2000"


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_skyignore_wins_over_gitignore(local_cluster, tmp_path, method):
    _, nodes, key = local_cluster(1)
    (tmp_path / "keep.py").write_text("x")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_text("x")
    (tmp_path / "notes.log").write_text("x")
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / ".skyignore").write_text("data/\n")
    with NodeClient(nodes[0], key) as client:
        sync_dir(client, tmp_path, "~/sky_workdir", method=method)
        files = client.exec("cd sky_workdir && find . -type f | sort")[1].decode().split()
    assert files == ["./.gitignore", "./.skyignore", "./keep.py", "./notes.log"]


def test_gitignore_rules_apply_without_skyignore(tmp_path):
    (tmp_path / "a.py").write_text("x")
    (tmp_path / "out.log").write_text("x")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "x.o").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("secret.txt\n")
    (tmp_path / "sub" / "secret.txt").write_text("x")
    (tmp_path / "sub" / "ok.txt").write_text("x")
    (tmp_path / ".gitignore").write_text("*.log\nbuild/\n")
    files = list(iter_files(tmp_path, ignore_spec(tmp_path)))
    assert files == [".gitignore", "a.py", "sub/.gitignore", "sub/ok.txt"]


def test_rsync_and_sftp_send_the_same_files_for_nested_ignore_rules(local_cluster, tmp_path):
    _, nodes, key = local_cluster(1)
    source = tmp_path / "src"
    (source / "sub" / "deep").mkdir(parents=True)
    (source / "build").mkdir()
    for rel in ("a.py", "out.log", "build/x.o", "sub/secret.txt", "sub/ok.txt", "sub/deep/secret.txt"):
        (source / rel).write_text("x")
    (source / "sub" / "deep" / "keep me.txt").write_text("x")  # spaces survive the file list
    (source / ".gitignore").write_text("*.log\nbuild/\n")
    (source / "sub" / ".gitignore").write_text("secret.txt\n!deep/\n")
    landed = {}
    with NodeClient(nodes[0], key) as client:
        for method in ("rsync", "sftp"):
            sync_dir(client, source, f"~/{method}", method=method)
            out = client.exec(f"cd {method} && find . -type f | sort")[1].decode()
            landed[method] = out.splitlines()
    assert landed["rsync"] == landed["sftp"]
    assert "./sub/ok.txt" in landed["rsync"] and "./sub/deep/keep me.txt" in landed["rsync"]
    assert not any(name.endswith(("secret.txt", ".log", ".o")) for name in landed["rsync"])


def test_rsync_recurses_only_where_that_sends_what_the_file_list_holds(local_cluster, tmp_path):
    _, nodes, key = local_cluster(1)
    plain = tmp_path / "plain"
    _make_tree(plain, 30)
    (plain / "empty" / "deeper").mkdir(parents=True)
    assert sync.select_files(plain).whole_tree  # rsync walks it itself: no list of every file
    linked = tmp_path / "linked"
    _make_tree(linked, 3)
    (linked / "outside").symlink_to(plain / "pkg1", target_is_directory=True)
    assert not sync.select_files(linked).whole_tree  # the list skips a symlinked directory; rsync would not
    ignored = tmp_path / "ignored"
    _make_tree(ignored, 3)
    (ignored / ".gitignore").write_text("pkg1/\n")
    assert not sync.select_files(ignored).whole_tree
    landed = {}
    with NodeClient(nodes[0], key) as client:
        for source in (plain, linked):
            for method in ("rsync", "sftp"):
                sync_dir(client, source, f"~/{source.name}-{method}", method=method)
                out = client.exec(f"cd {source.name}-{method} && find . | sort")[1].decode()
                landed[source.name, method] = out.splitlines()
    # Recursing or not, both transports leave the same tree: no empty directory, nothing through the link.
    assert landed["plain", "rsync"] == landed["plain", "sftp"]
    assert "./empty" not in landed["plain", "rsync"] and len(landed["plain", "rsync"]) == 1 + 20 + 30
    assert landed["linked", "rsync"] == landed["linked", "sftp"]
    assert not any(name.startswith("./outside") for name in landed["linked", "rsync"])


def test_a_node_without_rsync_gets_the_workdir_over_sftp(local_cluster, tmp_path, monkeypatch):
    """`auto` tries rsync at once (no separate check over another connection); a node whose shell cannot find
    rsync fails it, and the SFTP path sends the files instead; the next sync over that client goes straight
    to SFTP."""
    _, nodes, key = local_cluster(1)
    _make_tree(tmp_path, 5)
    monkeypatch.setattr(sync, "REMOTE_RSYNC", "rsync-not-installed")
    with NodeClient(nodes[0], key) as client:
        first = sync_dir(client, tmp_path, "~/sky_workdir")
        assert first.method == "sftp" and len(first.files_sent) == 5
        assert client.remote_has_rsync is False
        assert client.exec("find sky_workdir -type f | wc -l")[1].strip() == b"5"
        assert sync_dir(client, tmp_path, "~/sky_workdir").method == "sftp"
        with pytest.raises(sync.NoRemoteRsync, match="rsync-not-installed"):
            sync_dir(client, tmp_path, "~/sky_workdir", method="rsync")


def test_auto_sync_uses_rsync_where_the_node_has_it(local_cluster, tmp_path):
    _, nodes, key = local_cluster(1)
    _make_tree(tmp_path, 5)
    with NodeClient(nodes[0], key) as client:
        assert sync_dir(client, tmp_path, "~/sky_workdir").method == "rsync"
        assert client.remote_has_rsync is True
