"""Container images and a private registry for the container tests, made on this machine (no public
registry is reachable from CI): a Debian bookworm root filesystem from `debootstrap` (the mirror the
machine's apt sources name), imported into Podman; an image with PyTorch added from this test run's own
virtualenv (the same CPython minor version as Debian's python3); Debian's `docker-registry` on loopback
with htpasswd authentication, marked insecure (plain HTTP) for Podman by a drop-in of its own.

The images are kept in Podman's storage under names of their own (built once per machine, under a lock:
test files running side by side share them); the registry lives as long as its fixture.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

from tests.ports import free_port

BASE_IMAGE = "localhost/airflow-sky-test-base:bookworm"
TORCH_IMAGE = f"localhost/airflow-sky-test-torch:{importlib.metadata.version('torch').replace('+', '-')}"
# What this machine's sandbox needs from Podman (its default crun and ulimits fail here): the deployment's
# `[sky] docker_run_options`, as a real deployment would set it for its own machines.
RUN_OPTIONS = "--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
_CACHE = Path(os.environ.get("AIRFLOW_SKY_TEST_CACHE", "/var/tmp/airflow-sky-test-cache"))
_DIST_PACKAGES = "/usr/local/lib/python3.11/dist-packages"


def _run(*args: str, timeout: float = 900, **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])}... failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    _CACHE.mkdir(parents=True, exist_ok=True)
    with open(_CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], timeout=120).returncode == 0


def _debian_mirror() -> str:
    """The Debian archive this machine's apt uses (apt says which; never a host written here)."""
    uris = _run("apt-get", "indextargets", "--format", "$(REPO_URI)").stdout.split()
    archive = sorted({u for u in uris if "security" not in u and "/debian" in u})
    if not archive:
        raise RuntimeError(f"apt names no Debian archive: {sorted(set(uris))}")
    return archive[0]


def base_image() -> str:
    """Debian bookworm (minbase + python3) as a Podman image: what `image_id: docker:` needs (bash)."""
    with _locked("base"):
        if _exists(BASE_IMAGE):
            return BASE_IMAGE
        with tempfile.TemporaryDirectory(dir=_CACHE) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(
                "debootstrap",
                "--variant=minbase",
                "--include=python3",
                "bookworm",
                str(rootfs),
                _debian_mirror(),
                timeout=1200,
            )
            tar = Path(tmp) / "rootfs.tar"
            _run("tar", "-C", str(rootfs), "-cf", str(tar), ".")
            _run("podman", "import", str(tar), BASE_IMAGE)
    return BASE_IMAGE


def _torch_paths() -> list[Path]:
    """torch and what it requires, as installed in this virtualenv (top-level files and packages)."""
    seen: set[str] = set()
    todo = ["torch"]
    tops: set[Path] = set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for requirement in map(Requirement, dist.requires or []):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for file in dist.files or []:
            top = Path(str(dist.locate_file(file)))
            while top.parent != Path(str(dist.locate_file(""))):
                top = top.parent
            if not str(file).startswith("..") and top.name != "__pycache__":
                tops.add(top)
    return sorted(tops)


def torch_image() -> str:
    """The base image plus this run's PyTorch (CPU) in Debian's python3: torch.distributed from the image."""
    with _locked("torch"):
        if _exists(TORCH_IMAGE):
            return TORCH_IMAGE
        base = base_image()
        paths = _torch_paths()
        site = paths[0].parent
        name = f"airflow-sky-test-build-{os.getpid()}"
        copy = f"mkdir -p {_DIST_PACKAGES} && cd /src && cp -a {' '.join(p.name for p in paths)} {_DIST_PACKAGES}/"
        try:
            _run(
                "podman",
                "run",
                *RUN_OPTIONS.split(),
                "--name",
                name,
                "-v",
                f"{site}:/src:ro",
                base,
                "/bin/bash",
                "-c",
                copy,
            )
            _run("podman", "commit", name, TORCH_IMAGE, timeout=1200)
        finally:
            subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=300)
    return TORCH_IMAGE


NO_BASH_IMAGE = "localhost/airflow-sky-test-nobash:1"


def image_without_bash() -> str:
    """An image with one file and no shell: what `image_id` must refuse with a clear error."""
    with _locked("nobash"):
        if not _exists(NO_BASH_IMAGE):
            with tempfile.TemporaryDirectory(dir=_CACHE) as tmp:
                (Path(tmp) / "root" / "etc").mkdir(parents=True)
                (Path(tmp) / "root" / "etc" / "motd").write_text("no shell here\n")
                _run("tar", "-C", str(Path(tmp) / "root"), "-cf", str(Path(tmp) / "r.tar"), ".")
                _run("podman", "import", str(Path(tmp) / "r.tar"), NO_BASH_IMAGE)
    return NO_BASH_IMAGE


class Registry:
    """Debian's docker-registry on 127.0.0.1:<free port> with one htpasswd user; `push(image, path)`."""

    USER = "sky-puller"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.password = f"pw-{os.urandom(8).hex()}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._dropin = Path(f"/etc/containers/registries.conf.d/zz-airflow-sky-test-{self.port}.conf")

    def __enter__(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        htpasswd = self.root / "htpasswd"
        _run("htpasswd", "-Bbc", str(htpasswd), self.USER, self.password)
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"http:\n  addr: {self.host}\n"
            f"auth:\n  htpasswd:\n    realm: airflow-sky-tests\n    path: {htpasswd}\n"
        )
        # Podman speaks HTTPS to a registry unless told it is insecure: the machine's own setting.
        self._dropin.parent.mkdir(parents=True, exist_ok=True)
        self._dropin.write_text(f'[[registry]]\nlocation = "{self.host}"\ninsecure = true\n')
        log = open(self.root / "registry.log", "wb")
        self._proc = subprocess.Popen(
            [shutil.which("docker-registry") or "docker-registry", "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)
            except urllib.error.HTTPError as e:
                if e.code == 401:  # up, and asking for the password
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(
                    f"the registry did not come up: {(self.root / 'registry.log').read_text()}"
                )
            time.sleep(0.2)
        return self

    def push(self, image: str, path: str) -> str:
        """Push a local image to this registry as `path` (e.g. `sky/torch:1`); returns its reference."""
        reference = f"{self.host}/{path}"
        _run(
            "podman",
            "push",
            "--tls-verify=false",
            "--compression-format",  # zstd: several times faster than gzip for a GB of PyTorch
            "zstd",
            "--creds",
            f"{self.USER}:{self.password}",
            image,
            f"docker://{reference}",
            timeout=1200,
        )
        return reference

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
            if self._proc.poll() is None:
                self._proc.kill()
        self._dropin.unlink(missing_ok=True)


def remove_pulled(reference: str) -> None:
    """Forget a pulled copy, so that the next job pulls it again (a replacement node must pull)."""
    subprocess.run(["podman", "rmi", "-f", reference], capture_output=True, timeout=300)


def node_containers(cluster: str | None = None) -> list[str]:
    """Names of the containers airflow-sky started on this machine (any state), or `cluster`'s."""
    label = "airflow-sky.node" if cluster is None else f"airflow-sky.cluster={cluster}"
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return sorted(out.split())
