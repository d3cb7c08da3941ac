"""A git repository served on loopback over HTTP (git's dumb protocol), optionally behind a token.

The bare repository is kept fetchable by `git update-server-info` after every change, and a small threaded
`http.server` serves its files. With a token, every request needs Basic auth whose password is the token
(401 with a WWW-Authenticate challenge otherwise, as a private HTTPS remote answers). `delay_s` slows each
response, so a clone lasts long enough to be watched.
"""

from __future__ import annotations

import base64
import functools
import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

# Commits made here never read the user's or the machine's git config.
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with the test identity; returns stdout (stripped); raises with stderr on failure."""
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


class _Handler(http.server.SimpleHTTPRequestHandler):
    token: str | None = None
    delay_s: float = 0.0
    seen: list[tuple[str, bool]]

    def do_GET(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        authorized = self._authorized()
        self.seen.append((self.path, authorized))
        if not authorized:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def _authorized(self) -> bool:
        if self.token is None:
            return True
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        _, _, password = base64.b64decode(header[6:]).decode(errors="replace").partition(":")
        return password == self.token

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read `seen`
        pass


class GitServer:
    """A bare repository `repo.git` under `root`, served at `self.url`, with a work tree to commit from."""

    def __init__(self, root: Path, token: str | None = None, delay_s: float = 0.0) -> None:
        self.root = root
        self.bare = root / "srv" / "repo.git"
        self.work = root / "work"
        self.bare.parent.mkdir(parents=True)
        git("init", "-q", "--bare", "-b", "main", str(self.bare))
        git("init", "-q", "-b", "main", str(self.work))
        git("remote", "add", "origin", str(self.bare), cwd=self.work)
        self.seen: list[tuple[str, bool]] = []
        handler = type("Handler", (_Handler,), {"token": token, "delay_s": delay_s, "seen": self.seen})
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(self.bare.parent))
        )
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/repo.git"

    def commit(self, files: Mapping[str, str], message: str = "change", branch: str = "main") -> str:
        """Write `files` on `branch` (created from the current commit when new), push; returns the sha."""
        if git("rev-parse", "--all", cwd=self.work):  # (the first commit lands on main)
            exists = bool(git("branch", "--list", branch, cwd=self.work))
            git("checkout", "-q", *([branch] if exists else ["-b", branch]), cwd=self.work)
        for name, text in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "origin", branch, cwd=self.work)
        self._publish()
        return git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str, sha: str, message: str | None = None) -> None:
        """A tag at `sha` (annotated with a message), pushed."""
        git("tag", *(["-a", "-m", message] if message else []), name, sha, cwd=self.work)
        git("push", "-q", "origin", name, cwd=self.work)
        self._publish()

    def _publish(self) -> None:
        git("update-server-info", cwd=self.bare)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def serve_repo(root: Path, token: str | None = None, delay_s: float = 0.0) -> Iterator[GitServer]:
    server = GitServer(root, token=token, delay_s=delay_s)
    try:
        yield server
    finally:
        server.close()
