"""file_mounts: the remote paths of a task and what lands there (a local path, a bucket URI or a bucket).

Pure rules, checked after `$VAR` substitution as SkyPilot does; a problem is one SpecError line naming the
field.
"""

from __future__ import annotations

import copy
import dataclasses
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.task import overrides as ov
from airflow_sky.task.diagnostics import SpecContext, show
from airflow_sky.task.schema import BUCKET_URI_SCHEMES, STORAGE_SCHEMA
from airflow_sky.task.validate import validate

WORKDIR_ON_NODE = "sky_workdir"  # ~/sky_workdir, where the workdir lands on every node
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")


@dataclasses.dataclass(frozen=True)
class StorageMount:
    """A file_mounts storage mapping: a bucket (`name`/`store`) and/or a `source`, mounted or copied."""

    name: str | None = None
    source: str | tuple[str, ...] | None = None
    store: str | None = None  # lower case: s3, gcs, r2, ...
    mode: str | None = None  # upper case: MOUNT (SkyPilot's default), COPY, MOUNT_CACHED
    persistent: bool | None = None
    config: dict[str, Any] | None = None  # SkyPilot's volume settings; kept, not acted on

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if isinstance(self.source, tuple):
            data["source"] = list(self.source)
        return {key: value for key, value in data.items() if value is not None}


FileMountSource = str | StorageMount


def is_bucket_uri(text: str) -> bool:
    """True for 's3://...', 'gs://...' and the other bucket URIs file_mounts accept."""
    match = _URI.match(text)
    return match is not None and match["scheme"].lower() in BUCKET_URI_SCHEMES


def parse_file_mounts(
    mounts: dict[str, Any], envs: Mapping[str, str], ctx: SpecContext, unset: Sequence[str] = ()
) -> dict[str, FileMountSource]:
    """file_mounts, `$VAR`s substituted -> {remote path: local path/URI or StorageMount}.

    As in SkyPilot, a storage mapping is checked after substitution (`store: $STORE`); in a template
    (`unset`: names still without a value) a storage field that uses one is not checked yet.
    """
    result: dict[str, FileMountSource] = {}
    for raw_dst, raw_src in mounts.items():
        dst, src = ov.substitute(raw_dst, envs), ov.substitute(raw_src, envs)
        path = ["file_mounts", dst]
        dst = _remote_path(dst, ctx, path)
        if dst in result:
            raise ctx.error(path, f"remote path given twice (as {raw_dst!r} after $VAR substitution)")
        result[dst] = (
            _mount_source(src, ctx, path) if isinstance(src, str) else _storage(src, ctx, path, unset)
        )
    return result


def _remote_path(dst: str, ctx: SpecContext, path: Sequence[Any]) -> str:
    if not dst.strip() or dst.strip() == "~":
        raise ctx.error(path, f"remote path must be a path below / or ~/, got {show(dst)}")
    if ".." in dst.split("/"):
        raise ctx.error(
            path,
            "remote path must not contain '..' (it could land outside the node's home or workdir); "
            f"give an absolute path (/data/x), a path below ~ (~/x) or a path in the workdir (x, "
            f"which lands in ~/{WORKDIR_ON_NODE}/x)",
        )
    if not (dst.startswith("/") or dst.startswith("~/")):
        # As in SkyPilot: a relative remote path is below the workdir.
        dst = posixpath.normpath(f"~/{WORKDIR_ON_NODE}/{dst}")
    return dst


def _storage(
    src: dict[str, Any], ctx: SpecContext, path: Sequence[Any], unset: Sequence[str]
) -> StorageMount:
    validate({k: v for k, v in src.items() if not _uses(v, unset)}, STORAGE_SCHEMA, ctx, path)
    if "name" not in src and "source" not in src:
        raise ctx.error(path, "a storage mapping needs a `name` (bucket) or a `source`")
    if str(src.get("store", "")).lower() == "volume":
        raise ctx.error(
            [*path, "store"],
            "SkyPilot volumes (store: volume, a disk created on the node) are not supported; "
            "use a bucket store or a local path",
        )
    source = src.get("source")
    if isinstance(source, str):
        _mount_source(source, ctx, [*path, "source"])
    return StorageMount(
        name=src.get("name"),
        source=tuple(source) if isinstance(source, list) else source,
        store=src["store"].lower() if "store" in src else None,
        mode=src["mode"].upper() if "mode" in src else None,
        persistent=src.get("persistent"),
        config=copy.deepcopy(src.get("config")),
    )


def _uses(value: Any, names: Sequence[str]) -> bool:
    """Whether a string still refers to one of `names` as $NAME or ${NAME}."""
    return isinstance(value, str) and any(re.search(rf"\$(?:{n}\b|\{{{n}\}})", value) for n in names)


def _mount_source(src: str, ctx: SpecContext, path: Sequence[Any]) -> str:
    if not src.strip():
        raise ctx.error(path, "must be a local path, a bucket URI or a storage mapping, got an empty string")
    match = _URI.match(src)
    if match and match["scheme"].lower() not in BUCKET_URI_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in BUCKET_URI_SCHEMES)
        raise ctx.error(path, f"unsupported URI scheme {match['scheme']!r}; supported: {schemes}")
    return src
