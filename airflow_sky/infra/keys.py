"""Private keys handed in as text (a connection's secret) become 0600 files that SSH can read."""

from __future__ import annotations

import hashlib
import os

from airflow_sky.infra.home import sky_home


def write_key_file(label: str, private_key: str) -> str:
    """`private_key` as a 0600 file of this user (content-addressed: a rotated key gets a new file)."""
    directory = sky_home() / "ssh" / "pool-keys"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    digest = hashlib.sha256(private_key.encode()).hexdigest()[:16]
    safe_label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    path = directory / f"{safe_label}-{digest}"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(private_key if private_key.endswith("\n") else private_key + "\n")
        os.replace(tmp, path)
    return str(path)
