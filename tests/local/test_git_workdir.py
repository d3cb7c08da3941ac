"""Git workdirs: the commit a job pins (git ls-remote here) and its checkout on real local nodes, from a
repository served over HTTP on loopback (tests/gitserver.py), public or behind a token."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from airflow_sky.errors import RemoteError, SkyError, SpecError
from airflow_sky.gang.job import JobHandle
from airflow_sky.gang.phases import job_states, register_job
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import git_commit as gc
from airflow_sky.node import git_workdir as gw
from airflow_sky.node.client import NodeClient
from airflow_sky.node.files import upload_task_files
from airflow_sky.task import GitWorkdir, Task
from airflow_sky.task.redaction import sensitive_values
from tests.gitserver import GitServer, git, serve_repo

TOKEN = "tok-7f3a9c-never-shown"


def _head(client: NodeClient) -> str:
    rc, out, err = client.exec("git -C sky_workdir rev-parse HEAD")
    assert rc == 0, err
    return out.decode().strip()


@pytest.fixture
def repo(tmp_path: Path):
    with serve_repo(tmp_path / "git") as server:
        yield server


@pytest.fixture
def private_repo(tmp_path: Path):
    with serve_repo(tmp_path / "private", token=TOKEN) as server:
        yield server


# ---- on nodes ------------------------------------------------------------------------------------------


def test_two_nodes_check_out_the_same_commit_at_a_branch_then_at_a_commit(local_cluster, repo: GitServer):
    first = repo.commit({"train.py": "print('v1')\n"})
    dev = repo.commit({"train.py": "print('dev')\n"}, branch="dev")
    _, nodes, key = local_cluster(2)
    pinned = gc.resolve_commit(GitWorkdir(repo.url, "dev"), {})
    assert pinned == dev
    lines: list[str] = []
    for node in nodes:
        with NodeClient(node, key) as client:
            assert gw.checkout(client, GitWorkdir(repo.url, "dev"), pinned, {}, lines.append) == dev
            assert _head(client) == dev
            assert client.exec("cat sky_workdir/train.py")[1] == b"print('dev')\n"
            # The same nodes at a commit: a detached checkout of exactly that sha.
            assert (
                gw.checkout(client, GitWorkdir(repo.url, first[:10]), first[:10], {}, lines.append) == first
            )
            assert _head(client) == first
            assert client.exec("git -C sky_workdir symbolic-ref -q HEAD")[0] != 0  # detached
    assert lines[0] == f"cloned {repo.url} at dev ({dev}) -> ~/sky_workdir on rank 0 (new clone)"
    assert lines[2].startswith(f"cloned {repo.url} at dev ({dev}) -> ~/sky_workdir on rank 1")
    assert f"at {first[:10]} ({first})" in lines[1]


def test_a_kept_node_fetches_the_moved_branch_and_replaces_what_is_no_clone_of_the_url(
    local_cluster, repo: GitServer, tmp_path: Path
):
    old = repo.commit({"a.txt": "old\n"})
    _, nodes, key = local_cluster(1)
    lines: list[str] = []
    with NodeClient(nodes[0], key) as client:
        # A workdir synced by an earlier job on this kept node: replaced by the clone.
        client.exec("mkdir -p sky_workdir && echo stale > sky_workdir/stale.txt")
        assert gw.checkout(client, GitWorkdir(repo.url), old, {}, lines.append) == old
        assert client.exec("ls sky_workdir")[1].split() == [b"a.txt"]
        client.exec("echo output > sky_workdir/result.txt")  # a file the job wrote stays on a re-checkout
        new = repo.commit({"a.txt": "new\n"})
        moved = gc.resolve_commit(GitWorkdir(repo.url, "main"), {})
        assert moved == new
        assert gw.checkout(client, GitWorkdir(repo.url, "main"), moved, {}, lines.append) == new
        assert client.exec("cat sky_workdir/a.txt sky_workdir/result.txt")[1] == b"new\noutput\n"
        assert lines[-1].endswith("(kept clone, fetched)")
        # A clone of another repository is replaced too.
        with serve_repo(tmp_path / "other") as other:
            elsewhere = other.commit({"b.txt": "b\n"})
            assert gw.checkout(client, GitWorkdir(other.url), elsewhere, {}, lines.append) == elsewhere
            assert client.exec("ls sky_workdir")[1].split() == [b"b.txt"]
            assert lines[-1].endswith("(new clone)")


def test_a_private_repository_clones_with_git_token_and_a_wrong_token_fails_clearly(
    local_cluster, private_repo: GitServer
):
    commit = private_repo.commit({"secret_model.py": "x = 1\n"})
    _, nodes, key = local_cluster(1)
    # GIT_TOKEN given as an env (not a secret): SkyPilot treats it as a secret all the same.
    task = Task(run="true", envs={"GIT_TOKEN": TOKEN}, workdir={"url": private_repo.url})
    assert sensitive_values(task) == {"GIT_TOKEN": TOKEN}
    assert gc.resolve_commit(task.workdir, task.envs_and_secrets) == commit  # type: ignore[arg-type]
    with NodeClient(nodes[0], key) as client:
        assert gc.checkout_task_workdir(client, task, commit, lambda line: None) == commit
        assert _head(client) == commit
        client.exec("rm -rf sky_workdir")  # (a kept clone that has the commit would not fetch at all)
        with pytest.raises(RemoteError) as failed:
            gw.checkout(client, GitWorkdir(private_repo.url), commit, {"GIT_TOKEN": "wrong-one"}, print)
    message = str(failed.value)
    assert message.startswith(
        f"workdir.url: checking out {private_repo.url} at HEAD ({commit}) on node rank 0"
    )
    assert "Authentication failed" in message and "check that GIT_TOKEN" in message
    assert "wrong-one" not in message and TOKEN not in message
    with pytest.raises(SpecError) as unresolved:
        gc.resolve_commit(GitWorkdir(private_repo.url), {"GIT_TOKEN": "wrong-one"})
    assert str(unresolved.value).startswith(f"workdir.url: cannot read {private_repo.url}: ")
    assert "wrong-one" not in str(unresolved.value)
    with pytest.raises(SpecError, match="give it as the secret GIT_TOKEN"):
        gc.resolve_commit(GitWorkdir(private_repo.url), {})


def test_the_token_is_on_no_command_line_and_in_no_file_left_on_the_node(local_cluster, tmp_path: Path):
    _, nodes, key = local_cluster(1)
    # Each response waits, so the clone lasts long enough for the process list to be read many times.
    with serve_repo(tmp_path / "slow", token=TOKEN, delay_s=0.2) as server:
        commit = server.commit({f"f{i}.txt": f"{i}\n" for i in range(8)})
        with NodeClient(nodes[0], key) as client:
            assert client.exec("touch .before-clone")[0] == 0
        seen: list[bytes] = []
        done = threading.Event()

        def work() -> None:
            try:
                pinned = gc.resolve_commit(GitWorkdir(server.url), {"GIT_TOKEN": TOKEN})
                with NodeClient(nodes[0], key) as client:
                    gw.checkout(
                        client, GitWorkdir(server.url), pinned, {"GIT_TOKEN": TOKEN}, lambda line: None
                    )
            finally:
                done.set()

        worker = threading.Thread(target=work)
        worker.start()
        while not done.wait(0.02):  # (a pause per scan leaves the clone some CPU on a small machine)
            seen.extend(_command_lines())
        worker.join()
        with NodeClient(nodes[0], key) as client:
            assert _head(client) == commit
            # Every file the clone wrote in the node's home and tmp, read here: none holds the token.
            _, out, err = client.exec('find "$HOME" "${TMPDIR:-/tmp}" -type f -newer "$HOME/.before-clone"')
            written = out.decode().splitlines()
            assert len(written) > 5, err  # the clone's files: the search looked where they are
            holding = [path for path in written if TOKEN.encode() in (client.read_file(path) or b"")]
    assert holding == [], f"files on the node hold the token: {holding}"
    git_lines = [line for line in seen if b"git" in line and (b"fetch" in line or b"ls-remote" in line)]
    assert git_lines, "the scan saw no git process: it proves nothing"
    assert not [line for line in seen if TOKEN.encode() in line]
    assert server.seen and any(authorized for _, authorized in server.seen)


def _command_lines() -> list[bytes]:
    """Every process's command line, as `ps` shows them to any user of this machine."""
    lines = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as stream:
                    lines.append(stream.read().replace(b"\0", b" "))
            except OSError:
                continue
    return lines


# ---- resolving a ref on this machine --------------------------------------------------------------------


def test_resolve_commit_reads_branches_tags_and_commits(repo: GitServer):
    first = repo.commit({"a": "1"})
    second = repo.commit({"a": "2"})
    repo.tag("v1", first, message="annotated: its own object, peeled to the commit")
    repo.tag("light", second)
    resolve = lambda ref: gc.resolve_commit(GitWorkdir(repo.url, ref), {})  # noqa: E731
    assert resolve(None) == second  # the remote's HEAD
    assert resolve("main") == second and resolve("refs/heads/main") == second
    assert resolve("v1") == first and resolve("light") == second
    assert resolve(second[:7]) == second  # an abbreviated tip
    assert resolve(first[:12]) == first  # a tip of a tag (peeled)
    assert resolve("ABCDEF1234") == "abcdef1234"  # not at a tip: the nodes fetch it as given


def test_resolve_commit_errors_name_the_field_and_the_fix(repo: GitServer, tmp_path: Path, monkeypatch):
    repo.commit({"a": "1"})
    repo.commit({"a": "2"}, branch="feature")
    with pytest.raises(SpecError) as unknown:
        gc.resolve_commit(GitWorkdir(repo.url, "no-such-branch"), {})
    assert str(unknown.value) == (
        f"workdir.ref: 'no-such-branch' is no branch or tag of {repo.url}, nor a commit sha (7-40 hex "
        "digits); its branches: feature, main"
    )
    with pytest.raises(SpecError, match=r"^workdir.url: cannot read http://127.0.0.1:1/x.git: .+"):
        gc.resolve_commit(GitWorkdir("http://127.0.0.1:1/x.git"), {})
    with pytest.raises(SpecError, match="must not start with '-'"):
        gc.resolve_commit(GitWorkdir("--upload-pack=touch /tmp/x"), {})
    empty = tmp_path / "empty.git"
    git("init", "-q", "--bare", str(empty))
    with pytest.raises(SpecError, match="has no HEAD"):
        gc.resolve_commit(GitWorkdir(f"file://{empty}"), {})
    with pytest.raises(SpecError, match=r"^GIT_SSH_KEY_PATH: no key file /nonexistent/key on this machine"):
        gc.resolve_commit(GitWorkdir("git@example.com:o/r.git"), {"GIT_SSH_KEY_PATH": "/nonexistent/key"})
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(SkyError, match="git is not installed on this machine"):
        gc.resolve_commit(GitWorkdir(repo.url), {})


def test_checkout_task_workdir_does_nothing_without_a_git_workdir(tmp_path: Path):
    for task in (Task(run="true"), Task(run="true", workdir=str(tmp_path))):
        assert gc.checkout_task_workdir(None, task, "abc1234", print) is None  # type: ignore[arg-type]
    assert Task(run="true", workdir={"url": "https://h/o/r"}).resolved_workdir is None  # never rsynced


# ---- the pure parts, and the shell text run in a local bash ---------------------------------------------


def test_url_kinds_and_credentials_follow_skypilot():
    assert gw.url_kind("https://github.com/o/r.git") == "http"
    assert gw.url_kind("ssh://git@github.com:2222/o/r.git") == "ssh"
    assert gw.url_kind("git@github.com:o/r.git") == "ssh"
    assert gw.url_kind("file:///srv/r.git") == "other" and gw.url_kind("/srv/r.git") == "other"
    secrets = {"GIT_TOKEN": "t", "GIT_SSH_KEY_PATH": "~/.ssh/deploy"}
    assert gw.auth_for(GitWorkdir("https://h/o/r"), secrets) == gw.GitAuth(token="t")
    assert gw.auth_for(GitWorkdir("https://oauth2@h/o/r"), secrets).user == "oauth2"
    ssh = gw.auth_for(GitWorkdir("git@h:o/r"), secrets)
    assert ssh.token is None and ssh.ssh_key_path == os.path.expanduser("~/.ssh/deploy")
    assert gc.parse_ls_remote("a" * 40 + "\tHEAD\n" + "b" * 40 + "\trefs/tags/v1^{}\n") == {
        "HEAD": "a" * 40,
        "refs/tags/v1^{}": "b" * 40,
    }
    assert gc.pick_commit({"refs/heads/x": "a" * 40}, "y") is None


def _run_local(
    command: str, home: Path, stdin: bytes = b"", path: str | None = None
) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": path or os.environ["PATH"], "TMPDIR": str(home.parent / "tmp")}
    (home.parent / "tmp").mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", command], input=stdin, env=env, capture_output=True, timeout=120)


def test_checkout_command_in_a_local_bash_clones_then_reuses_and_quotes_every_value(
    repo: GitServer, tmp_path: Path
):
    commit = repo.commit({"x.py": "x\n"})
    home = tmp_path / "home"
    first = _run_local(gw.checkout_command(repo.url, commit), home)
    assert first.returncode == 0, first.stderr
    assert gw.parse_checkout_output(first.stdout, commit) == gw.CheckoutResult(commit, "cloned")
    again = _run_local(gw.checkout_command(repo.url, commit[:8]), home)
    assert gw.parse_checkout_output(again.stdout, commit[:8]) == gw.CheckoutResult(commit, "present")
    # Values that would be shell syntax stay data.
    hostile = f"{repo.url}'; touch {tmp_path}/pwned; echo '$(touch {tmp_path}/pwned2)"
    bad = _run_local(gw.checkout_command(hostile, "deadbeef"), home)
    assert bad.returncode == 5 and not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    missing = _run_local(gw.checkout_command(repo.url, "0" * 40), tmp_path / "home2")
    assert missing.returncode == 6 and b"has no commit" in missing.stderr


def test_checkout_command_hands_the_ssh_key_to_ssh_in_a_0600_file_it_removes(tmp_path: Path):
    # A stand-in `ssh` on PATH records how git calls it: the key file, its mode and content, the options.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "ssh-call"
    fake_ssh = bin_dir / "ssh"
    fake_ssh.write_text(
        "#!/bin/bash\n"
        f'{{ echo "$*"; for a in "$@"; do [ -f "$a" ] && stat -c %a "$a" && cat "$a"; done; }} > {record}\n'
        "exit 1\n"
    )
    fake_ssh.chmod(0o755)
    command = gw.checkout_command("git@example.invalid:o/r.git", "a" * 40, ssh_key=True, ssh_url=True)
    result = _run_local(
        command, tmp_path / "home", stdin=b"-----KEY-----\n", path=f"{bin_dir}:{os.environ['PATH']}"
    )
    assert result.returncode == 5
    args, mode, key_text = record.read_text().splitlines()[:3]
    key_file = args.split("-i ", 1)[1].split()[0]
    assert "-o BatchMode=yes" in args and "-o IdentitiesOnly=yes" in args and "accept-new" in args
    assert mode == "600" and key_text == "-----KEY-----"
    assert not os.path.exists(key_file)  # removed when the script ended


def test_the_token_reaches_git_only_through_the_environment_in_a_local_bash(
    private_repo: GitServer, tmp_path: Path
):
    commit = private_repo.commit({"m.py": "m\n"})
    command = gw.checkout_command(private_repo.url, commit, token_user="x-access-token")
    assert TOKEN not in command
    ok = _run_local(command, tmp_path / "home", stdin=gw.stdin_payload(TOKEN, None))
    assert ok.returncode == 0, ok.stderr
    assert gw.parse_checkout_output(ok.stdout, commit) == gw.CheckoutResult(commit, "cloned")
    config = (tmp_path / "home" / "sky_workdir" / ".git" / "config").read_text()
    assert TOKEN not in config and "credential" not in config


# ---- one commit per job ---------------------------------------------------------------------------------


def test_a_job_pins_its_commit_once_and_every_sync_checks_out_that_one(
    local_cluster, private_repo: GitServer
):
    pinned = private_repo.commit({"a.txt": "1\n"})
    name, nodes, key = local_cluster(2)
    cluster = open_cluster(name, "local")
    task = Task(
        name="pin", num_nodes=2, run="true", secrets={"GIT_TOKEN": TOKEN}, workdir={"url": private_repo.url}
    )
    handle = register_job(cluster, task, nodes, submit_key="run-1")
    assert handle.git_commit == pinned
    assert JobHandle.from_dict(handle.to_dict(nodes=False)).git_commit == pinned  # the provision XCom has it
    assert job_states(cluster).require(handle.job_id).info["git_commit"] == pinned
    moved = private_repo.commit({"a.txt": "2\n"})
    # A retried provision (same submit key) keeps the job's commit, though main moved meanwhile.
    assert register_job(cluster, task, nodes, submit_key="run-1").git_commit == pinned
    for node in nodes:
        with NodeClient(node, key) as client:
            upload_task_files(client, task, lambda line: None, git_commit=handle.git_commit)
            assert _head(client) == pinned
    # The next job on the kept cluster pins where the branch is now.
    assert register_job(cluster, task, nodes, submit_key="run-2").git_commit == moved
