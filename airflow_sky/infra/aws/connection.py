"""The aws infra's side of its Airflow connection: boto3 clients from the amazon provider's hooks, the
`airflow_sky` settings, the credentials check, and the account's zone names and ids."""

from __future__ import annotations

import threading
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.aws.settings import DEFAULT_CONN_ID, AwsSettings, settings_from_extra
from airflow_sky.infra.keys import public_key_of


class AwsConnection:
    """Clients, settings and zones of one aws connection; cached, safe to share between threads."""

    def __init__(self, conn_id: str | None = None) -> None:
        self.conn_id = conn_id or DEFAULT_CONN_ID
        self._settings: AwsSettings | None = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._zone_ids: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _client(self, service: str, region: str) -> Any:
        """A boto3 client from the amazon provider's hooks (the connection's credentials and endpoint)."""
        with self._lock:
            client = self._clients.get((service, region))
            if client is None:
                if service == "ec2":
                    from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

                    client = EC2Hook(
                        aws_conn_id=self.conn_id, region_name=region, api_type="client_type"
                    ).conn
                else:
                    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

                    client = AwsBaseHook(
                        aws_conn_id=self.conn_id, client_type=service, region_name=region
                    ).conn
                self._clients[(service, region)] = client
            return client

    @property
    def settings(self) -> AwsSettings:
        if self._settings is None:
            from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

            config = AwsBaseHook(aws_conn_id=self.conn_id, client_type="ec2").conn_config
            self._settings = settings_from_extra(self.conn_id, dict(config.extra_config), config.region_name)
        return self._settings

    def node_bucket_identity(self) -> frozenset[str]:
        return frozenset({"s3"}) if self.settings.iam_instance_profile else frozenset()

    def check_config(self) -> None:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        # Credentials resolve locally (connection, environment, profile, instance role) or not at all.
        if AwsBaseHook(aws_conn_id=self.conn_id, client_type="ec2").get_session().get_credentials() is None:
            raise SpecError(
                f"aws: no AWS credentials: the Airflow connection {self.conn_id!r} has none and none were "
                "found in the environment, ~/.aws or an instance role (see docs/infra-aws.md)"
            )
        public_key_of(self.settings.ssh_key_file)  # the key parses: its public half is what EC2 imports

    def _zones(self, region: str) -> dict[str, str]:
        """Zone name -> zone id in `region`, as this account sees them."""
        with self._lock:
            cached = self._zone_ids.get(region)
        if cached is None:
            zones = self._client("ec2", region).describe_availability_zones()["AvailabilityZones"]
            cached = {z["ZoneName"]: z["ZoneId"] for z in zones}
            with self._lock:
                self._zone_ids[region] = cached
        return cached

    def zone_id(self, region: str, zone: str) -> str:
        """`zone` as the catalog names it (its id): a name (us-east-1a) is looked up, an id kept."""
        zones = self._zones(region)
        if zone in zones.values():
            return zone
        if zone not in zones:
            raise SpecError(f"zone: {zone} is not a zone of {region} (zones: {', '.join(sorted(zones))})")
        return zones[zone]

    def zone_name(self, region: str, zone_id: str) -> str:
        return next((name for name, zid in self._zones(region).items() if zid == zone_id), zone_id)
