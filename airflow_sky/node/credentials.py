"""A node's bucket credential, minted on the worker from an Airflow connection and scoped to the job.

A node never holds a connection's own keys. Where the infra gives the nodes no identity of their own
(aws instance profile, gcp service account: node_identity, `env_auth`), the worker mints, per job:

- s3: an STS session whose session policy (credential_scope.s3_session_policy) allows only the job's
  buckets and folders. A connection with IAM user keys calls GetFederationToken (up to 36 h); one that
  assumes a role (`role_arn`), or that names a role for the nodes (`airflow_sky.node_role_arn` in its
  extra), calls AssumeRole with the policy (the role's own limit, 1 to 12 h). The session's rights are
  the connection's (or the role's) rights AND the policy: never more.
- gcs: a downscoped access token (Credential Access Boundary, credential_scope.gcs_boundary_rules),
  valid as long as the source token (about 1 h).

A credential that expires is served to the node's rclone (node.credential_server) and minted again while
the job runs, at half its life, by whoever watches the job (gang.credential_refresh).

Which connection a store's credential is minted from (node_connections): on aws (s3) and gcp (gcs) the
job's bucket connection (`aws_conn_id` / `gcp_conn_id`, default the provisioning one: only a scoped
session of it ever leaves the worker). On local and ssh nodes, and for the other cloud's store, a
connection for node data of its own, `[sky] node_aws_conn_id` (default `sky_nodes_aws`) and
`[sky] node_gcp_conn_id` (default `sky_nodes_gcp`): never the provisioning one. Without it, a job with
such a bucket fails before anything is made, naming the setting. An S3-compatible store without STS can
opt out of scoping on that connection only (`"airflow_sky": {"node_credentials": "keys"}`): its keys
then reach the nodes as they are, so they must open nothing but the jobs' data.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_sky.errors import SkyError
from airflow_sky.node.credential_scope import Scope, gcs_boundary_rules, policy_text, s3_session_policy
from airflow_sky.node.settings import sky_setting

NODE_CONN_SETTINGS = {"s3": "node_aws_conn_id", "gcs": "node_gcp_conn_id"}  # in the [sky] section
DEFAULT_NODE_CONNS = {"s3": "sky_nodes_aws", "gcs": "sky_nodes_gcp"}
BUCKET_CONNS = {"s3": "aws_default", "gcs": "google_cloud_default"}  # the job's bucket connection's default
_OWN_STORE = {"aws": "s3", "gcp": "gcs"}
FEDERATION_DURATION_S = 36 * 3600  # GetFederationToken's longest (IAM user keys)
ROLE_DURATION_S = 12 * 3600  # AssumeRole's longest, when the role's MaxSessionDuration allows it
ROLE_FALLBACK_S = 3600  # every role allows an hour (a chained role: no more)
_NAME = re.compile(r"[^\w+=,.@-]")


@dataclasses.dataclass(frozen=True)
class NodeCredential:
    """A scoped credential for one store: rclone options (secrets in them) and when it expires."""

    options: Mapping[str, str]
    expires: datetime.datetime | None  # None: it does not expire (a node-data connection's keys)

    def __repr__(self) -> str:
        return f"NodeCredential(expires={self.expires}, options=<redacted>)"


def node_connections(infra: str | None, aws_conn_id: str | None, gcp_conn_id: str | None) -> dict[str, str]:
    """store -> the Airflow connection its node credentials are minted from on `infra` (module doc)."""
    cloud = (infra or "local").split("/", 1)[0].lower()
    chosen = {"s3": aws_conn_id, "gcs": gcp_conn_id}
    found = {}
    for store, setting in NODE_CONN_SETTINGS.items():
        if _OWN_STORE.get(cloud) == store:
            found[store] = chosen[store] or BUCKET_CONNS[store]
        else:
            found[store] = sky_setting(setting) or DEFAULT_NODE_CONNS[store]
    return found


def check_node_connection(store: str, conn_id: str, infra: str | None, uri: str) -> None:
    """Raise SkyError naming the setting when the connection for `store`'s node credentials is missing."""
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception as e:  # Airflow's not-found types differ between the task SDK and the CLI
        cloud = (infra or "local").split("/", 1)[0]
        own = _OWN_STORE.get(cloud) == store
        fix = (
            "create it, or name another with the job's bucket connection"
            if own
            else f"create it with credentials that open only the jobs' data (never the provisioning "
            f"connection's), or name another with `[sky] {NODE_CONN_SETTINGS[store]}`"
        )
        raise SkyError(
            f"file_mounts: {uri} on {cloud} nodes: node credentials for {store} come from the Airflow "
            f"connection {conn_id!r}, which cannot be read ({type(e).__name__}); {fix} "
            "(docs/infra-local.md#node-credentials)"
        ) from e


def provider_class(module: str, name: str, store: str, extra: str) -> Any:
    """A provider's class, or a SkyError with the install hint (providers are optional extras)."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise SkyError(f"{store} file_mounts need {name}: pip install 'airflow-sky[{extra}]' ({e})") from e


def session_name(label: str) -> str:
    """An STS session/federated-user name from `label` (2 to 32 characters of [\\w+=,.@-])."""
    return ("sky-" + _NAME.sub("-", label))[:32]


def mint_s3(hook: Any, scopes: Sequence[Scope], label: str) -> NodeCredential:
    """A session for the s3 `scopes` from the connection of `hook` (an AwsBaseHook); module doc."""
    config = hook.conn_config
    sky = dict((config.extra_config or {}).get("airflow_sky") or {})
    if sky.get("node_credentials") == "keys":
        credentials = hook.get_credentials()
        options = {"access_key_id": credentials.access_key, "secret_access_key": credentials.secret_key}
        if credentials.token:
            options["session_token"] = credentials.token
        return NodeCredential(options, None)
    policy = policy_text(s3_session_policy(scopes))
    role = sky.get("node_role_arn") or config.role_arn
    name = session_name(label)
    try:
        if role:
            response = _assume_role(hook, config, role, name, policy, own_role=not sky.get("node_role_arn"))
        else:
            sts = _sts_client(hook.get_session(), config)
            response = sts.get_federation_token(
                Name=name, Policy=policy, DurationSeconds=FEDERATION_DURATION_S
            )
    except Exception as e:  # botocore's ClientError and its credential errors
        how = "AssumeRole" if role else "GetFederationToken"
        hint = (
            ""
            if role
            else "; temporary credentials (a session, an instance role) cannot federate: name a role for "
            "the nodes in the connection's extra (airflow_sky.node_role_arn)"
        )
        raise SkyError(
            f"node credentials from connection {config.conn_id!r}: {how} failed ({type(e).__name__}: "
            f"{_short(e)}){hint} (docs/infra-aws.md#node-credentials)"
        ) from e
    c = response["Credentials"]
    options = {
        "access_key_id": c["AccessKeyId"],
        "secret_access_key": c["SecretAccessKey"],
        "session_token": c["SessionToken"],
    }
    return NodeCredential(options, _utc(c.get("Expiration")))


def _assume_role(hook: Any, config: Any, role: str, name: str, policy: str, own_role: bool) -> Any:
    if own_role:
        # The connection assumes `role` itself: ask for it again from its base credentials, with the policy.
        factory = provider_class(
            "airflow.providers.amazon.aws.hooks.base_aws", "BaseSessionFactory", "s3", "aws"
        )
        session = factory(conn=config, region_name=config.region_name).basic_session
    else:
        session = hook.get_session()
    sts = _sts_client(session, config)
    kwargs = {"RoleArn": role, "RoleSessionName": name, "Policy": policy}
    try:
        return sts.assume_role(**kwargs, DurationSeconds=ROLE_DURATION_S)
    except Exception as e:
        if "DurationSeconds" not in str(e):
            raise
        return sts.assume_role(**kwargs, DurationSeconds=ROLE_FALLBACK_S)  # the role allows less


def _sts_client(session: Any, config: Any) -> Any:
    endpoint = config.get_service_endpoint_url("sts") if hasattr(config, "get_service_endpoint_url") else None
    return session.client(
        "sts",
        endpoint_url=endpoint or config.endpoint_url,
        region_name=config.region_name or "us-east-1",
        config=getattr(config, "botocore_config", None),  # the connection's `config_kwargs`
    )


def mint_gcs(hook: Any, scopes: Sequence[Scope]) -> NodeCredential:
    """A downscoped access token for the gcs `scopes` from the connection of `hook` (a GoogleBaseHook)."""
    from google.auth.transport.requests import Request

    source, _ = hook.get_credentials_and_project_id()
    token = downscoped_credentials(source, scopes)
    try:
        token.refresh(Request())
    except Exception as e:  # google.auth's RefreshError, transport errors
        raise SkyError(
            f"node credentials from connection {hook.gcp_conn_id!r}: the downscoped token exchange failed "
            f"({type(e).__name__}: {_short(e)}) (docs/infra-gcp.md#node-credentials)"
        ) from e
    expires = token.expiry.replace(tzinfo=datetime.UTC) if token.expiry else None
    expiry = expires.isoformat().replace("+00:00", "Z") if expires else ""
    import json

    return NodeCredential({"token": json.dumps({"access_token": token.token, "expiry": expiry})}, expires)


def downscoped_credentials(source: Any, scopes: Sequence[Scope]) -> Any:
    """google.auth's downscoped Credentials of `source` for the gcs `scopes` (not yet exchanged)."""
    from google.auth import downscoped

    rules = []
    for rule in gcs_boundary_rules(scopes):
        condition = rule.get("availability_condition")
        rules.append(
            downscoped.AccessBoundaryRule(
                available_resource=rule["available_resource"],
                available_permissions=rule["available_permissions"],
                availability_condition=downscoped.AvailabilityCondition(**condition) if condition else None,
            )
        )
    boundary = downscoped.CredentialAccessBoundary(rules=rules)
    return downscoped.Credentials(source_credentials=source, credential_access_boundary=boundary)


def _utc(value: Any) -> datetime.datetime | None:
    if not isinstance(value, datetime.datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _short(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return text[:300]
