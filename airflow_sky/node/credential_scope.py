"""What a node's bucket credential may reach, as pure data: the job's buckets and prefixes, an S3 session
policy and a GCS Credential Access Boundary built from them.

A node never holds the keys of the connection that provisions (node.credentials mints a credential from
these documents); the credential reaches the objects below each of the job's bucket mounts (read, write,
delete, list) and nothing else: no other bucket, no other prefix of the same bucket (another job's jobs
bucket prefix), no other service (EC2, DynamoDB, Compute: a session policy only narrows, it grants no
action it does not name).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_sky.errors import SkyError
from airflow_sky.task.storage import BucketMount

# STS refuses a session policy whose plain text is over 2048 characters (the packed size is checked too).
MAX_SESSION_POLICY_CHARS = 2048
MAX_BOUNDARY_RULES = 10  # a Credential Access Boundary holds at most 10 rules
_S3_OBJECT_ACTIONS = [
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
]
_S3_BUCKET_ACTIONS = ["s3:GetBucketLocation", "s3:ListBucketMultipartUploads"]
GCS_ROLE = "inRole:roles/storage.objectAdmin"  # objects only: read, write, delete, list; no bucket admin


@dataclasses.dataclass(frozen=True, order=True)
class Scope:
    """One place a job may reach: a bucket, and a folder in it ("" for the whole bucket)."""

    store: str  # s3 | gcs
    bucket: str
    prefix: str = ""


def job_scopes(mounts: Iterable[BucketMount]) -> list[Scope]:
    """The places of a job's bucket mounts, smallest set: a folder inside a whole bucket already allowed
    is dropped, and so is a folder inside another allowed folder."""
    scopes = sorted({Scope(m.store, m.bucket, m.prefix.strip("/")) for m in mounts})
    kept: list[Scope] = []
    for scope in scopes:
        if not any(_covers(k, scope) for k in kept):
            kept.append(scope)
    return kept


def _covers(outer: Scope, inner: Scope) -> bool:
    if (outer.store, outer.bucket) != (inner.store, inner.bucket):
        return False
    return outer.prefix == "" or inner.prefix == outer.prefix or inner.prefix.startswith(outer.prefix + "/")


def s3_session_policy(scopes: Sequence[Scope]) -> dict[str, Any]:
    """The IAM session policy of a node credential for the s3 `scopes`.

    Objects: exactly `prefix` (a mount of one object) and everything below `prefix/`; listing: the bucket
    only with an `s3:prefix` inside the folder. A whole-bucket scope allows the bucket's every object.
    """
    s3 = [s for s in scopes if s.store == "s3"]
    if not s3:
        raise SkyError("node credentials: no s3 bucket to scope a credential to")
    objects: list[str] = []
    statements: list[dict[str, Any]] = []
    whole = sorted({s.bucket for s in s3 if not s.prefix})
    if whole:
        statements.append({"Effect": "Allow", "Action": "s3:ListBucket", "Resource": _arns(whole)})
    folders: dict[str, list[str]] = {}
    for scope in s3:
        if scope.prefix:
            folders.setdefault(scope.bucket, []).extend([scope.prefix, f"{scope.prefix}/*"])
            objects += [_arn(f"{scope.bucket}/{scope.prefix}"), _arn(f"{scope.bucket}/{scope.prefix}/*")]
        else:
            objects.append(_arn(f"{scope.bucket}/*"))
    for bucket, prefixes in sorted(folders.items()):
        statements.append(
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": _arn(bucket),
                "Condition": {"StringLike": {"s3:prefix": prefixes}},
            }
        )
    buckets = sorted({s.bucket for s in s3})
    statements.append({"Effect": "Allow", "Action": _S3_BUCKET_ACTIONS, "Resource": _arns(buckets)})
    statements.append({"Effect": "Allow", "Action": _S3_OBJECT_ACTIONS, "Resource": objects})
    policy = {"Version": "2012-10-17", "Statement": statements}
    text = policy_text(policy)
    if len(text) > MAX_SESSION_POLICY_CHARS:
        raise SkyError(
            f"file_mounts: the job's {len(s3)} s3 bucket place(s) make a node credential policy of "
            f"{len(text)} characters, over STS's {MAX_SESSION_POLICY_CHARS}; mount fewer buckets or folders "
            "(a folder above several mounts counts once)"
        )
    return policy


def policy_text(policy: dict[str, Any]) -> str:
    """The policy as STS gets it: compact JSON (its length is what STS counts)."""
    return json.dumps(policy, separators=(",", ":"))


def _arn(path: str) -> str:
    return f"arn:aws:s3:::{path}"


def _arns(buckets: Sequence[str]) -> list[str]:
    return [_arn(b) for b in buckets]


def gcs_boundary_rules(scopes: Sequence[Scope]) -> list[dict[str, Any]]:
    """The Credential Access Boundary rules of a node token for the gcs `scopes` (google.auth.downscoped's
    AccessBoundaryRule fields): one rule per bucket; a bucket reached only in folders carries a condition
    that admits those objects and listings inside those folders."""
    by_bucket: dict[str, list[str]] = {}
    for scope in scopes:
        if scope.store == "gcs":
            by_bucket.setdefault(scope.bucket, []).append(scope.prefix)
    if not by_bucket:
        raise SkyError("node credentials: no gcs bucket to scope a token to")
    if len(by_bucket) > MAX_BOUNDARY_RULES:
        raise SkyError(
            f"file_mounts: {len(by_bucket)} gcs buckets; a node token's access boundary holds at most "
            f"{MAX_BOUNDARY_RULES}; mount fewer buckets"
        )
    rules = []
    for bucket, prefixes in sorted(by_bucket.items()):
        rule: dict[str, Any] = {
            "available_resource": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
            "available_permissions": [GCS_ROLE],
        }
        if "" not in prefixes:
            rule["availability_condition"] = {
                "expression": _gcs_condition(bucket, sorted(prefixes)),
                "title": "the job's folders",
            }
        rules.append(rule)
    return rules


def _gcs_condition(bucket: str, prefixes: Sequence[str]) -> str:
    """A CEL expression: the object is one of the folders' (or the folder object itself), or a listing
    asks inside one of them. A folder with a quote or backslash is refused (it would end the CEL string)."""
    terms = []
    for prefix in prefixes:
        if "'" in prefix or "\\" in prefix:
            raise SkyError(
                f"file_mounts: gs://{bucket}/{prefix}: a folder with a quote or backslash cannot be scoped "
                "in a node token; rename the folder"
            )
        name = f"projects/_/buckets/{bucket}/objects/{prefix}"
        terms.append(f"resource.name == '{name}'")
        terms.append(f"resource.name.startsWith('{name}/')")
        terms.append(
            f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('{prefix}/')"
        )
        terms.append(f"api.getAttribute('storage.googleapis.com/objectListPrefix', '') == '{prefix}'")
    return " || ".join(terms)
