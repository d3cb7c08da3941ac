"""A real S3 API on loopback (moto's server app under werkzeug) that counts the object bytes it serves to
each kind of client: rclone on the nodes, or anything else (boto3/s3fs on an Airflow worker).

The count is how the tests prove that no object passes through the worker: every client announces itself
in its User-Agent (rclone: `rclone/v1.60`; botocore and s3fs: `Boto3/...`, `aiobotocore/...`).

moto keeps its buckets per process, not per server: the test files an xdist worker runs one after another
see each other's buckets. Each file uses bucket names of its own.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import boto3
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from tests.ports import free_port


class CountingApp:
    """WSGI middleware: object-GET response bytes per client kind ("rclone" or "worker")."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.bytes: collections.Counter[str] = collections.Counter()
        self.gets: collections.Counter[str] = collections.Counter()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        kind = "rclone" if "rclone" in environ.get("HTTP_USER_AGENT", "").lower() else "worker"
        path = environ.get("PATH_INFO", "")
        # Path-style object GETs: /<bucket>/<key...> (a bucket listing is /<bucket> or has ?list-type).
        is_object_get = environ.get("REQUEST_METHOD") == "GET" and path.strip("/").count("/") >= 1
        body = self.app(environ, start_response)
        if not is_object_get:
            return body
        return self._count(kind, body)

    def _count(self, kind: str, body: Iterable[bytes]) -> Iterator[bytes]:
        size = 0
        try:
            for chunk in body:
                size += len(chunk)
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                body.close()  # type: ignore[attr-defined]
            with self.lock:
                self.bytes[kind] += size
                self.gets[kind] += 1

    def reset(self) -> None:
        with self.lock:
            self.bytes.clear()
            self.gets.clear()


class S3Server:
    """moto's S3 on 127.0.0.1:<free port>; `endpoint`, a boto3 `client`, the `counts`, and the Airflow
    connection (as AIRFLOW_CONN_AWS_DEFAULT's JSON) that reaches it."""

    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.counts = CountingApp(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            "127.0.0.1", self.port, self.counts, threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> S3Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)

    @property
    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    @property
    def connection(self) -> str:
        return json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
            }
        )

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def buckets(self) -> list[str]:
        return sorted(b["Name"] for b in self.client.list_buckets()["Buckets"])
