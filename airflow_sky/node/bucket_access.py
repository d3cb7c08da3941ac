"""Before the worker touches a bucket: can it reach the store at all? Without its Airflow connection the
providers fall back to the cloud SDK's own credentials (environment, config files, instance identity) and,
without those, to anonymous access, which ends, after many seconds of retries, in "bucket does not exist":
the wrong cause. Said here at once, naming the connection and how to define one."""

from __future__ import annotations

from airflow_sky.errors import SkyError

DEFAULT_CONNECTIONS = {"s3": "aws_default", "gs": "google_cloud_default"}  # the providers' defaults

_CONNECTION_EXAMPLE = {
    "s3": (
        'AIRFLOW_CONN_AWS_DEFAULT=\'{"conn_type": "aws", "login": "<access key id>", '
        '"password": "<secret key>", "extra": {"endpoint_url": "https://<s3-compatible endpoint>"}}\' '
        "(leave endpoint_url out for AWS itself)"
    ),
    "gs": 'AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT=\'{"conn_type": "google_cloud_platform", "extra": '
    '{"key_path": "<service account key file>"}}\'',
}
_SDK_CHAIN = {
    "s3": "boto3 finds no AWS credentials here (environment, ~/.aws, instance profile)",
    "gs": "google.auth finds no application default credentials here",
}


def require_store_credentials(scheme: str, conn_id: str | None, uri: str, field: str) -> None:
    """Raise SkyError when neither the connection `conn_id` (None: the store's default one) nor the cloud
    SDK's own chain gives credentials for `uri` (s3 or gs); returns at once when the connection exists."""
    if scheme not in _SDK_CHAIN:
        return
    conn_id = conn_id or DEFAULT_CONNECTIONS[scheme]
    if _connection_exists(conn_id) or _sdk_has_credentials(scheme):
        return
    raise SkyError(
        f"{field}: {uri}: the worker has no credentials for it: no Airflow connection {conn_id!r} is defined "
        f"and {_SDK_CHAIN[scheme]}. Define the connection, e.g. {_CONNECTION_EXAMPLE[scheme]} "
        "(docs/user-guide.md#buckets)"
    )


def _connection_exists(conn_id: str) -> bool:
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # Airflow's not-found types differ between the task SDK and the CLI's engine
        return False
    return True


def _sdk_has_credentials(scheme: str) -> bool:
    if scheme == "s3":
        import boto3

        return boto3.session.Session().get_credentials() is not None
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return False  # the gcp extra is missing: storage_path says so with its install hint
    try:
        google.auth.default()
    except DefaultCredentialsError:
        return False
    return True
