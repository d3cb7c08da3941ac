"""The REST API of a running Airflow (3.x, `/api/v2`), as managed jobs use it.

Where the API is and how to log in, first found wins:

1. `AIRFLOW_SKY_API_URL`, with `AIRFLOW_SKY_API_TOKEN`, or `AIRFLOW_SKY_API_USERNAME` and
   `AIRFLOW_SKY_API_PASSWORD` (a token is then asked for at `/auth/token`);
2. the `api:` section of `~/.airflow_sky/config.yaml` (or `$AIRFLOW_SKY_HOME/config.yaml`): `url`, and
   `token` or `username`/`password`;
3. what Airflow's own CLI (`airflowctl`) uses: `api_url` in `$AIRFLOW_HOME/<env>.json` (`env` from
   `AIRFLOW_CLI_ENVIRONMENT`, default `production`) and the token in `AIRFLOW_CLI_TOKEN`.

Without credentials, a token is asked for without any (the simple auth manager with all users admins, as in
`airflow standalone` setups for development).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import tenacity

from airflow_sky.client.config_file import config_section
from airflow_sky.errors import SkyError, SpecError

PAGE = 100  # the API's [api] maximum_page_limit default
# Airflow's default `[scheduler] allowed_run_id_pattern`: what a DAG run id (a managed job's id) may be.
_RUN_ID = re.compile(r"[A-Za-z0-9_.~:+-]+")


def api_path(*segments: object) -> str:
    """A REST path from its segments, each quoted whole: a value holding `/`, `?`, `#` or `..` stays one
    segment (an all-dots one is percent-encoded too, or the URL's dot segments would resolve it)."""
    quoted = [quote(str(segment), safe="") for segment in segments]
    return "".join("/" + (q.replace(".", "%2E") if not q.strip(".") else q) for q in quoted)


def check_job_id(job_id: str) -> str:
    """`job_id` when it can be a DAG run id (letters, digits, `_.~:+-`, not only dots); else SpecError."""
    if not _RUN_ID.fullmatch(job_id) or not job_id.strip("."):
        raise SpecError(
            f"job id {job_id!r}: not a job id (a DAG run id: letters, digits and _.~:+-); "
            "`airflow-sky jobs queue` lists them"
        )
    return job_id


class ApiError(SkyError):
    """The Airflow REST API refused a request or could not be reached."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclasses.dataclass(frozen=True)
class ApiConfig:
    url: str
    token: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    source: str = "defaults"


def api_config() -> ApiConfig:
    """Where the Airflow API is and how to log in (see the module's docstring for the order)."""
    env = os.environ
    if env.get("AIRFLOW_SKY_API_URL"):
        return ApiConfig(
            env["AIRFLOW_SKY_API_URL"],
            env.get("AIRFLOW_SKY_API_TOKEN"),
            env.get("AIRFLOW_SKY_API_USERNAME"),
            env.get("AIRFLOW_SKY_API_PASSWORD"),
            "AIRFLOW_SKY_API_URL",
        )
    api, config_file = config_section(
        "api",
        ("url", "token", "username", "password"),
        "a mapping with url (and token, or username/password)",
    )
    if api is not None:
        if not isinstance(api.get("url"), str):
            raise SkyError(
                f"{config_file}: api: must be a mapping with url (and token, or username/password)"
            )
        return ApiConfig(
            api["url"], api.get("token"), api.get("username"), api.get("password"), str(config_file)
        )
    airflow_home = Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow")
    ctl_file = airflow_home / f"{env.get('AIRFLOW_CLI_ENVIRONMENT', 'production')}.json"
    if ctl_file.is_file():
        try:
            url = json.loads(ctl_file.read_text()).get("api_url")
        except (json.JSONDecodeError, AttributeError) as e:
            raise SkyError(f"{ctl_file}: not an airflowctl config: {e}") from e
        if isinstance(url, str):
            return ApiConfig(url, env.get("AIRFLOW_CLI_TOKEN"), source=str(ctl_file))
    return ApiConfig("http://localhost:8080", env.get("AIRFLOW_CLI_TOKEN"))


# Tries per request for a server that is slow or answers 5xx (waits of 1, 2, 4 s between).
ATTEMPTS = 4
# Errors after which the server may be busy rather than absent (and may have processed the request).
_UNANSWERED = (httpx.TimeoutException, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class AirflowApi:
    """A logged-in client of one Airflow's REST API; every error becomes ApiError with what was asked."""

    def __init__(
        self, config: ApiConfig | None = None, timeout_s: float = 30.0, attempts: int = ATTEMPTS
    ) -> None:
        self.config = config or api_config()
        self.http = httpx.Client(base_url=self.config.url.rstrip("/"), timeout=timeout_s)
        self.attempts = attempts
        self.http.headers["Authorization"] = f"Bearer {self._token()}"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AirflowApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _token(self) -> str:
        if self.config.token:
            return self.config.token
        where = f"{self.config.url} (from {self.config.source})"
        try:
            if self.config.username:
                body = {"username": self.config.username, "password": self.config.password or ""}
                response = self._send("POST", "/auth/token", json=body)
            else:
                response = self._send("GET", "/auth/token")
        except httpx.HTTPError as e:
            raise ApiError(f"cannot reach the Airflow API at {where}: {e}") from e
        if response.status_code >= 400:
            hint = (
                "check the username and password"
                if self.config.username
                else "set AIRFLOW_SKY_API_TOKEN, or AIRFLOW_SKY_API_USERNAME and AIRFLOW_SKY_API_PASSWORD"
            )
            raise ApiError(
                f"logging in to the Airflow API at {where} failed ({response.status_code}): {hint}"
            )
        return str(response.json()["access_token"])

    def _send(self, method: str, path: str, attempts: int | None = None, **kwargs: Any) -> httpx.Response:
        """One request, tried again (with backoff) when the server took it but did not answer in time, dropped
        it, or answered 5xx (a refused connection is not tried again: nothing listens there): a busy API server (a wide job's tasks all talk to it) is not a failed
        launch. A POST retried after a timeout that answers 409 was created by the attempt that timed out:
        the ids posted here (run ids, secret keys) are unique to one launch, so that counts as created."""
        uncertain = False  # an earlier attempt may have been processed

        def send() -> httpx.Response:
            nonlocal uncertain
            try:
                response = self.http.request(method, path, **kwargs)
            except _UNANSWERED:
                uncertain = True
                raise
            if response.status_code == 409 and method == "POST" and uncertain:
                return httpx.Response(200, json={}, request=response.request)
            if response.status_code >= 500:
                response.raise_for_status()  # an HTTPStatusError: tried again
            return response

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_UNANSWERED)
            | tenacity.retry_if_exception(
                lambda e: isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500
            ),
            stop=tenacity.stop_after_attempt(attempts or self.attempts),
            wait=tenacity.wait_exponential(multiplier=1, max=8),
            reraise=True,
        )
        try:
            return retrying(send)
        except httpx.HTTPStatusError as e:
            return e.response  # still 5xx after every attempt: reported as the server's answer

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._send(method, f"/api/v2{path}", **kwargs)
        except httpx.HTTPError as e:
            raise ApiError(f"{method} {path}: cannot reach the Airflow API at {self.config.url}: {e}") from e
        if response.status_code >= 400:
            raise ApiError(
                f"{method} {path}: {response.status_code} {_detail(response)}", response.status_code
            )
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def plugin_get(self, path: str, **params: Any) -> Any:
        """GET `path` of a plugin the API server mounts beside its REST API (e.g. /airflow-sky/api/v1/...),
        logged in as for the REST API, asked once (the caller can do without the answer). An answer that is
        no JSON (an API server without the plugin may answer its UI's page) is an ApiError too."""
        try:
            response = self._send("GET", path, attempts=1, params=params)
        except httpx.HTTPError as e:
            raise ApiError(f"GET {path}: cannot reach the Airflow API at {self.config.url}: {e}") from e
        if response.status_code >= 400:
            raise ApiError(f"GET {path}: {response.status_code} {_detail(response)}", response.status_code)
        try:
            return response.json()
        except ValueError as e:
            raise ApiError(f"GET {path}: not a JSON answer ({response.headers.get('content-type')})") from e

    def pages(self, path: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paged list (`key`: the list's field, e.g. task_instances)."""
        offset = 0
        while True:
            page = self.get(path, limit=PAGE, offset=offset, **params)
            items = page.get(key) or []
            yield from items
            offset += len(items)
            if not items or offset >= int(page.get("total_entries", 0)):
                return


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (json.JSONDecodeError, AttributeError):
        return response.text[:300]
    return json.dumps(detail) if not isinstance(detail, str) else detail
