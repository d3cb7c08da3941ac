"""Bucket file_mounts on the nodes: each node copies or mounts its buckets itself (rclone); no object passes
through the Airflow worker.

The worker only does what needs the bucket's owner: it creates named buckets that are absent, uploads a
local `source` into a bucket it creates, deletes a non-persistent bucket it created (`prepare_buckets`,
`delete_buckets`), and builds the remotes a node's rclone uses (`bucket_remotes`). Those remotes never
carry a connection's own keys: where the node has no identity of its own (an instance profile on aws, a
service account on gcp) they carry a credential minted for the job and scoped to its buckets and folders
(node.credentials); it travels in the SSH channel's stdin into 0600 files on the node, which teardown
removes (`detach_buckets`). A credential that expires (an STS session, a downscoped token) is not written
into rclone.conf: the node's mounts fetch it from the node's credential server (node.credential_server),
and whoever watches the job writes a fresh one there before it expires (`refresh_credentials`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shlex
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from airflow_sky.errors import RemoteError, SkyError
from airflow_sky.node import credential_scope, credential_server, credentials, rclone
from airflow_sky.node.bucket_access import require_store_credentials
from airflow_sky.node.client import NodeClient
from airflow_sky.node.storage import storage_path
from airflow_sky.task.storage import COPY, BucketMount

ATTACH_TIMEOUT_S = (
    24 * 3600
)  # a COPY of a large bucket takes as long as it takes; the sync task's deadline rules


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """What a node needs to attach a task's buckets. `remotes` may hold credentials: never log or XCom it."""

    mounts: tuple[BucketMount, ...]
    remotes: Mapping[str, Mapping[str, str]]
    plain_http: bool = False  # an endpoint without TLS (an emulator, a private S3-compatible store)
    expires: datetime.datetime | None = None  # when the first of its credentials expires (None: never)
    # store -> the credential its mounts fetch from the node's credential server (one that expires)
    served: Mapping[str, credentials.NodeCredential] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:  # the remotes hold secrets: a repr in a traceback must not show them
        return f"BucketPlan(mounts={[m.uri for m in self.mounts]}, remotes=<redacted>)"

    def secret_options(self) -> list[Mapping[str, str]]:
        """Every set of options that may hold a secret: the remotes', the served credentials'."""
        return [*self.remotes.values(), *(c.options for c in self.served.values())]

    def credential_files(self, mounts: Sequence[BucketMount] | None = None) -> dict[str, str]:
        """path below creds/ -> text: the served credential of each of `mounts` (default: all the plan's)."""
        files = {}
        for mount in self.mounts if mounts is None else mounts:
            credential = self.served.get(mount.store)
            if credential is not None and credential.expires is not None:
                name, text = credential_server.served_file(
                    mount.store, credential.options, credential.expires
                )
                files[f"{rclone.mount_key(mount.destination)}/{name}"] = text
        return files


def bucket_remotes(
    mounts: Sequence[BucketMount],
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
    node_identity: Collection[str] = (),
    node_conns: Mapping[str, str] | None = None,
) -> BucketPlan:
    """The rclone remotes the mounts' stores need, each with a credential scoped to the mounts' buckets and
    folders (node.credentials), or the node's own identity.

    node_identity: the stores the nodes reach with credentials of their own (the infra attached an
    instance profile or a service account): their remotes use that (`env_auth`) and carry no secret.
    node_conns: store -> the connection node credentials are minted from (credentials.node_connections);
    without it, the node-data connections of local nodes.
    """
    conns = {**credentials.node_connections(None, aws_conn_id, gcp_conn_id), **(node_conns or {})}
    scopes = credential_scope.job_scopes(mounts)
    remotes: dict[str, dict[str, str]] = {}
    served: dict[str, credentials.NodeCredential] = {}
    plain_http = False
    for store in sorted({m.store for m in mounts}):
        if store == "s3":
            own = "s3" in node_identity
            options, credential = _s3_remote(
                (aws_conn_id or credentials.BUCKET_CONNS["s3"]) if own else conns["s3"], own, scopes
            )
        else:
            options, credential = _gcs_remote(conns["gcs"], "gcs" in node_identity, scopes)
        if credential is not None and credential.expires is not None:
            served[store] = (
                credential  # fetched from the node's credential server, replaced before it expires
            )
            if store == "s3":
                options["env_auth"] = "true"
        elif credential is not None:
            options.update(credential.options)  # keys that do not expire (a store without STS)
        plain_http |= options.get("endpoint", "").startswith("http://")
        remotes[rclone.remote_name(store)] = options
    expires = min((c.expires for c in served.values() if c.expires), default=None)
    return BucketPlan(tuple(mounts), remotes, plain_http, expires, served)


def _s3_remote(
    conn_id: str, node_identity: bool, scopes: Sequence[credential_scope.Scope]
) -> tuple[dict[str, str], credentials.NodeCredential | None]:
    aws_hook = credentials.provider_class(
        "airflow.providers.amazon.aws.hooks.base_aws", "AwsBaseHook", "s3", "aws"
    )
    hook = aws_hook(aws_conn_id=conn_id, client_type="s3")
    config = hook.conn_config
    endpoint = config.get_service_endpoint_url("s3") if hasattr(config, "get_service_endpoint_url") else None
    endpoint = endpoint or config.endpoint_url
    options = {"type": "s3", "provider": "Other" if endpoint else "AWS"}
    region = config.region_name or hook.conn_region_name  # (the latter builds a whole client)
    if region:
        options["region"] = region
    if endpoint:
        options["endpoint"] = endpoint
        options["force_path_style"] = "true"
    if node_identity:
        options["env_auth"] = "true"
        return options, None
    return options, credentials.mint_s3(hook, scopes, "node")


def _gcs_remote(
    conn_id: str, node_identity: bool, scopes: Sequence[credential_scope.Scope]
) -> tuple[dict[str, str], credentials.NodeCredential | None]:
    google_hook = credentials.provider_class(
        "airflow.providers.google.common.hooks.base_google", "GoogleBaseHook", "gcs", "gcp"
    )
    options = {"type": "google cloud storage", "bucket_policy_only": "true"}
    if node_identity:
        options["env_auth"] = "true"
        return options, None
    hook = google_hook(gcp_conn_id=conn_id)
    # An emulator, as google-cloud-storage finds one (STORAGE_EMULATOR_HOST on the worker).
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        options["endpoint"] = emulator
    if hook._get_field("is_anonymous"):
        options["anonymous"] = "true"
        return options, None
    # Never the connection's key file: a downscoped token of it (about an hour). rclone 1.60's gcs remote
    # without a token or key uses application default credentials: the node's server (GCE_METADATA_HOST).
    return options, credentials.mint_gcs(hook, scopes)


def _config_tar(plan: BucketPlan) -> bytes:
    extra = {"rclone.conf": rclone.config_text(plan.remotes)}
    return credential_server.credentials_tar(plan.credential_files(), extra)


def attach_buckets(client: NodeClient, plan: BucketPlan, log: Callable[[str], None]) -> int:
    """Copy (COPY) or mount (MOUNT, MOUNT_CACHED) every bucket of `plan` on the node; returns files copied."""
    if not plan.mounts:
        return 0
    rank = client.node.rank
    started = time.monotonic()
    script = rclone.attach_script(plan.mounts, rank, plan.plain_http, served=set(plan.served))
    rc, out, err = client.exec(
        f"bash -c {shlex.quote(script)}", stdin=_config_tar(plan), timeout=ATTACH_TIMEOUT_S
    )
    if rc != 0:
        raise RemoteError(
            f"file_mounts on rank {rank}: {err.decode(errors='replace').strip() or out.decode()}"
        )
    by_destination = {m.destination: m for m in plan.mounts}
    copied = 0
    for line in out.decode(errors="replace").splitlines():
        words = line.split()
        if len(words) == 4 and words[0] == "copied" and words[1] in by_destination:
            mount, files, size = by_destination[words[1]], int(words[2]), int(words[3])
            copied += files
            log(
                f"copied {mount.uri} -> {mount.destination} on rank {rank} "
                f"({files} files, {size / 1e6:.1f} MB, node-side rclone, {time.monotonic() - started:.1f}s)"
            )
        elif len(words) == 3 and words[0] == "mounted" and words[1] in by_destination:
            mount = by_destination[words[1]]
            log(
                f"mounted {mount.uri} on {mount.destination} on rank {rank} ({mount.mode}, rclone pid {words[2]})"
            )
    return copied


def refresh_credentials(client: NodeClient, plan: BucketPlan) -> int:
    """Replace the served credentials of the plan's running mounts on the node (the copies are done) and
    make sure the node's credential server answers; returns how many files were replaced. The secrets
    travel in stdin, never on a command line."""
    files = plan.credential_files([m for m in plan.mounts if m.mode != COPY])
    if not files:
        return 0
    rc, out, err = client.exec(
        f"bash -c {shlex.quote(credential_server.refresh_script())}",
        stdin=credential_server.credentials_tar(files),
        timeout=credential_server.REFRESH_TIMEOUT_S,
    )
    words = out.decode(errors="replace").split()
    if rc != 0 or len(words) < 2 or words[-2] != "refreshed":
        raise RemoteError(
            f"refreshing the bucket credentials on rank {client.node.rank}: "
            f"{err.decode(errors='replace').strip()[-500:]}"
        )
    return int(words[-1])


def detach_buckets(client: NodeClient, log: Callable[[str], None], flush_timeout_s: int = 300) -> int:
    """Flush (bounded) and unmount the node's bucket mounts and remove their credentials; returns how many."""
    rc, out, err = client.exec(rclone.detach_script(flush_timeout_s), timeout=flush_timeout_s + 120)
    words = out.decode(errors="replace").split()
    if rc != 0 or len(words) < 2 or words[-2] != "detached":
        raise RemoteError(
            f"unmounting buckets on rank {client.node.rank}: {err.decode(errors='replace').strip()}"
        )
    count = int(words[-1])
    if count:
        log(f"unmounted {count} bucket mount(s) on rank {client.node.rank}; their credentials are removed")
    return count


# ---- the worker's part: buckets' lifecycle ------------------------------------------------------------


def prepare_buckets(
    mounts: Sequence[BucketMount],
    log: Callable[[str], None],
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
) -> list[str]:
    """Create named buckets that are absent and upload their local `source`; return the URIs created.

    A bucket given by URI must exist (SkyPilot's rule: airflow-sky never creates a bucket it was only
    pointed at). Empty buckets are fine.
    """
    created: list[str] = []
    for mount in mounts:
        field = f"file_mounts.{mount.destination}"
        scheme = urlparse(mount.bucket_uri).scheme
        require_store_credentials(
            scheme, {"s3": aws_conn_id, "gs": gcp_conn_id}.get(scheme), mount.bucket_uri, field
        )
        path = storage_path(mount.bucket_uri, aws_conn_id, gcp_conn_id, field=field)
        fs, bucket = path.fs, mount.bucket
        exists = _bucket_exists(fs, bucket, mount)
        if not exists:
            if not mount.create:
                raise SkyError(
                    f"file_mounts.{mount.destination}: bucket {mount.bucket_uri} does not exist; create it, or "
                    f"name it (`name: {bucket}`) so that airflow-sky creates it"
                )
            fs.mkdir(bucket)
            created.append(mount.bucket_uri)
            log(f"created bucket {mount.bucket_uri} for file_mounts.{mount.destination}")
        if mount.upload:
            started = time.monotonic()
            fs.put(mount.upload.rstrip("/") + "/", f"{bucket}/", recursive=True)
            log(
                f"uploaded {mount.upload} to {mount.bucket_uri} ({time.monotonic() - started:.1f}s) "
                f"for file_mounts.{mount.destination}"
            )
    return created


def _bucket_exists(fs: Any, bucket: str, mount: BucketMount) -> bool:
    try:
        fs.invalidate_cache()
        return bool(fs.exists(bucket))
    except PermissionError as e:
        raise SkyError(
            f"file_mounts.{mount.destination}: no access to bucket {mount.bucket_uri} with the connection ({e})"
        ) from e


def delete_buckets(
    uris: Sequence[str],
    log: Callable[[str], None],
    aws_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
) -> None:
    """Delete buckets airflow-sky created for `persistent: false` mounts, objects first."""
    for uri in uris:
        path = storage_path(uri, aws_conn_id, gcp_conn_id, field="file_mounts")
        bucket = urlparse(uri).netloc
        fs = path.fs
        fs.invalidate_cache()
        if fs.exists(bucket) and fs.find(bucket):
            fs.rm(f"{bucket}/", recursive=True)  # (s3fs removes the emptied bucket too)
        fs.invalidate_cache()
        if fs.exists(bucket):
            fs.rmdir(bucket)
        log(f"deleted bucket {uri} (persistent: false)")


def delete_prefix(
    uri: str, log: Callable[[str], None], aws_conn_id: str | None = None, gcp_conn_id: str | None = None
) -> int:
    """Delete every object below the folder `uri` (`s3://bucket/a/b` removes `a/b/...`, never `a/bc`);
    returns how many. Idempotent: a folder already gone deletes nothing."""
    parsed = urlparse(uri)
    folder = f"{parsed.netloc}/{parsed.path.strip('/')}/"
    fs = storage_path(uri, aws_conn_id, gcp_conn_id, field=uri).fs
    fs.invalidate_cache()
    objects = fs.find(folder)
    if objects:
        fs.rm(objects)
    log(f"removed {uri}/ ({len(objects)} object(s))")
    return len(objects)


def bucket_record(
    mounts: Sequence[BucketMount],
    aws_conn_id: str | None,
    gcp_conn_id: str | None,
    node_identity: Collection[str],
    created: Sequence[str] = (),
    infra: str | None = None,
) -> dict[str, Any]:
    """What the job state keeps of a task's buckets (no credential: they are minted again when needed),
    with the connections node credentials come from on `infra`; raises SkyError naming the setting when
    one of those connections is missing."""
    conns = credentials.node_connections(infra, aws_conn_id, gcp_conn_id)
    used: dict[str, str] = {}
    for mount in mounts:
        if mount.store not in node_identity and mount.store not in used:
            credentials.check_node_connection(mount.store, conns[mount.store], infra, mount.uri)
            used[mount.store] = conns[mount.store]
    return {
        "mounts": [m.to_dict() for m in mounts],
        "aws_conn_id": aws_conn_id,
        "gcp_conn_id": gcp_conn_id,
        "node_identity": sorted(node_identity),
        "node_conns": used,
        "created": list(created),
    }


def plan_from_record(record: Mapping[str, Any] | None) -> BucketPlan | None:
    """The BucketPlan of a job's bucket record (fresh credentials from its connections), or None."""
    if not record or not record.get("mounts"):
        return None
    mounts = [BucketMount.from_dict(m) for m in record["mounts"]]
    return bucket_remotes(
        mounts,
        record.get("aws_conn_id"),
        record.get("gcp_conn_id"),
        record.get("node_identity") or (),
        record.get("node_conns") or None,
    )
