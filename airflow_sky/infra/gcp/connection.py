"""The gcp infra's side of its Airflow connection: the google provider's hook and credentials, the
`airflow_sky` settings, and the Compute and Storage clients made from them."""

from __future__ import annotations

import threading
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.gcp.api import ComputeApi
from airflow_sky.infra.gcp.settings import DEFAULT_CONN_ID, GcpSettings, settings_from_extra
from airflow_sky.infra.keys import public_key_of


class GcpConnection:
    """Credentials, settings and clients of one gcp connection; cached, safe to share between threads."""

    poll_s: float  # how often the driver polls: the API's operation polls are no slower

    def __init__(self, conn_id: str | None = None) -> None:
        self.conn_id = conn_id or DEFAULT_CONN_ID
        self._settings: GcpSettings | None = None
        self._api: ComputeApi | None = None
        self._storage: Any = None
        self._lock = threading.Lock()

    def _hook(self) -> Any:
        from airflow.providers.google.cloud.hooks.compute import ComputeEngineHook

        return ComputeEngineHook(gcp_conn_id=self.conn_id)

    @property
    def settings(self) -> GcpSettings:
        if self._settings is None:
            try:
                extras = dict(self._hook().extras)
            except Exception as e:  # Airflow raises its own not-found types, which differ between contexts
                raise SpecError(f"gcp: Airflow connection {self.conn_id!r} cannot be read: {e}") from e
            project = extras.get("project") or extras.get("extra__google_cloud_platform__project")
            self._settings = settings_from_extra(self.conn_id, extras, project)
        return self._settings

    def _credentials(self) -> Any:
        if self.settings.anonymous_credentials:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()
        return self._hook().get_credentials()

    @property
    def api(self) -> ComputeApi:
        with self._lock:
            if self._api is None:
                s = self.settings
                self._api = ComputeApi(s.project, self._credentials(), s.compute_endpoint)
                self._api.poll_s = min(self._api.poll_s, self.poll_s)
            return self._api

    def _storage_client(self) -> Any:
        with self._lock:
            if self._storage is None:
                from google.cloud.storage import Client

                s = self.settings
                options = {"api_endpoint": s.storage_endpoint} if s.storage_endpoint else None
                self._storage = Client(
                    project=s.project, credentials=self._credentials(), client_options=options
                )
            return self._storage

    def node_bucket_identity(self) -> frozenset[str]:
        return frozenset({"gcs"}) if self.settings.service_account else frozenset()

    def check_config(self) -> None:
        try:
            self._credentials()
        except Exception as e:  # google.auth's DefaultCredentialsError, a key file that does not parse, ...
            raise SpecError(
                f"gcp: no usable Google credentials for connection {self.conn_id!r}: {e} (see docs/infra-gcp.md)"
            ) from e
        public_key_of(self.settings.ssh_key_file)
