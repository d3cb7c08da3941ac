"""A fake of Google Cloud Storage's JSON API, just enough for the gcp infra's state store, over real HTTP.

No GCS emulator implements generation preconditions (gcp-storage-emulator ignores `ifGenerationMatch`),
and the state store's whole point is its conditional writes. So this small threaded server plays the JSON
API for the tests: the requests google-cloud-storage's Client sends for bucket get/insert, object metadata,
media download, multipart upload, list (prefix, delimiter) and delete. It is written after GCS's documented
request and response shapes (https://cloud.google.com/storage/docs/json_api), not captured from a live
project. Preconditions (`ifGenerationMatch`, 0 meaning "must not exist"; `ifGenerationNotMatch`) are honoured
on upload, download, metadata get and delete and fail with 412 in GCS's error shape; generations come from
one global counter, so an object deleted and written again gets a new one. State lives in memory, behind a
lock. `forbid(bucket)` makes every request on that bucket answer 403, as for a caller without access.

Build the client with `client(fake)` (anonymous credentials, the fake's endpoint).
"""

from __future__ import annotations

import base64
import dataclasses
import email.parser
import email.policy
import hashlib
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import google_crc32c
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.ports import free_port

PROJECT = "test-project"


@dataclasses.dataclass(frozen=True)
class StoredObject:
    data: bytes
    generation: int
    content_type: str
    updated: str


class _Error(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def _precondition_failed() -> _Error:
    return _Error(412, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


class FakeGcs:
    """The fake server. `start()` binds 127.0.0.1 on a free port; `endpoint` is its base URL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[str, Any]] = {}
        self._objects: dict[tuple[str, str], StoredObject] = {}
        self._forbidden: set[str] = set()
        self._generations = itertools.count(1_700_000_000_000_000)
        self.log: list[str] = []  # "METHOD /path?query" of every request, in order
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle and inspection --------------------------------------------------------------------------

    def start(self) -> FakeGcs:
        fake = self

        class Handler(_Handler):
            gcs = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-gcs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def objects(self) -> dict[tuple[str, str], StoredObject]:
        """A snapshot of every object: (bucket, name) -> its data and generation."""
        with self._lock:
            return dict(self._objects)

    @property
    def buckets(self) -> dict[str, dict[str, Any]]:
        """A snapshot of every bucket's resource (as inserted, plus the fields GCS adds)."""
        with self._lock:
            return {name: dict(resource) for name, resource in self._buckets.items()}

    def add_bucket(self, name: str, location: str = "US") -> None:
        with self._lock:
            self._buckets.setdefault(name, self._bucket_resource({"name": name, "location": location}))

    def forbid(self, bucket: str) -> None:
        """Answer 403 to every request on `bucket` (existing or not), as GCS does for a caller without access."""
        with self._lock:
            self._forbidden.add(bucket)

    def allow(self, bucket: str) -> None:
        with self._lock:
            self._forbidden.discard(bucket)

    # -- the API, called by the handler with the lock not held ---------------------------------------------

    def _bucket_resource(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["name"]
        now = _now()
        return body | {
            "kind": "storage#bucket",
            "id": name,
            "selfLink": f"{self.endpoint}/storage/v1/b/{name}",
            "projectNumber": "123456789012",
            "location": str(body.get("location", "US")).upper(),
            "storageClass": body.get("storageClass", "STANDARD"),
            "metageneration": "1",
            "timeCreated": now,
            "updated": now,
            "etag": "CAE=",
        }

    def _object_resource(self, bucket: str, name: str, obj: StoredObject) -> dict[str, Any]:
        quoted = quote(name, safe="")
        crc = google_crc32c.value(obj.data).to_bytes(4, "big")
        return {
            "kind": "storage#object",
            "id": f"{bucket}/{name}/{obj.generation}",
            "selfLink": f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}",
            "mediaLink": (
                f"{self.endpoint}/download/storage/v1/b/{bucket}/o/{quoted}"
                f"?generation={obj.generation}&alt=media"
            ),
            "name": name,
            "bucket": bucket,
            "generation": str(obj.generation),
            "metageneration": "1",
            "contentType": obj.content_type,
            "storageClass": "STANDARD",
            "size": str(len(obj.data)),
            "md5Hash": base64.b64encode(hashlib.md5(obj.data).digest()).decode(),
            "crc32c": base64.b64encode(crc).decode(),
            "etag": base64.b64encode(str(obj.generation).encode()).decode(),
            "timeCreated": obj.updated,
            "updated": obj.updated,
        }

    def _check_bucket(self, bucket: str) -> None:
        if bucket in self._forbidden:
            raise _Error(
                403,
                "forbidden",
                f"anonymous caller does not have storage.objects.get access to the Google Cloud Storage "
                f"bucket. Permission 'storage.objects.get' denied on resource (or it may not exist). {bucket}",
            )
        if bucket not in self._buckets:
            raise _Error(404, "notFound", "The specified bucket does not exist.")

    def _current(self, bucket: str, name: str, query: dict[str, str]) -> StoredObject:
        """The object a read names (404 when absent or not at `generation`), after its preconditions."""
        self._check_bucket(bucket)
        obj = self._objects.get((bucket, name))
        if obj is None or ("generation" in query and int(query["generation"]) != obj.generation):
            raise _Error(404, "notFound", f"No such object: {bucket}/{name}")
        self._check_preconditions(obj, query)
        return obj

    @staticmethod
    def _check_preconditions(obj: StoredObject | None, query: dict[str, str]) -> None:
        generation = obj.generation if obj is not None else 0
        if "ifGenerationMatch" in query and int(query["ifGenerationMatch"]) != generation:
            raise _precondition_failed()
        if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"]) == generation:
            raise _precondition_failed()

    def get_bucket(self, bucket: str) -> dict[str, Any]:
        with self._lock:
            self._check_bucket(bucket)
            return dict(self._buckets[bucket])

    def insert_bucket(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("name", ""))
        if not name:
            raise _Error(400, "required", "Required")
        with self._lock:
            if name in self._forbidden:
                self._check_bucket(name)
            if name in self._buckets:
                raise _Error(
                    409,
                    "conflict",
                    "Your previous request to create the named bucket succeeded and you already own it.",
                )
            self._buckets[name] = self._bucket_resource(body)
            return dict(self._buckets[name])

    def get_object(self, bucket: str, name: str, query: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            return self._object_resource(bucket, name, self._current(bucket, name, query))

    def download(self, bucket: str, name: str, query: dict[str, str]) -> StoredObject:
        with self._lock:
            return self._current(bucket, name, query)

    def upload(
        self, bucket: str, name: str, data: bytes, content_type: str, query: dict[str, str]
    ) -> dict[str, Any]:
        with self._lock:
            self._check_bucket(bucket)
            self._check_preconditions(self._objects.get((bucket, name)), query)
            obj = StoredObject(data, next(self._generations), content_type, _now())
            self._objects[(bucket, name)] = obj
            return self._object_resource(bucket, name, obj)

    def delete(self, bucket: str, name: str, query: dict[str, str]) -> None:
        with self._lock:
            self._current(bucket, name, query)
            del self._objects[(bucket, name)]

    def list_objects(self, bucket: str, query: dict[str, str]) -> dict[str, Any]:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        with self._lock:
            self._check_bucket(bucket)
            found = sorted(
                (n, o) for (b, n), o in self._objects.items() if b == bucket and n.startswith(prefix)
            )
            items: list[dict[str, Any]] = []
            prefixes: set[str] = set()
            for name, obj in found:
                rest = name[len(prefix) :]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest[: rest.index(delimiter) + len(delimiter)])
                else:
                    items.append(self._object_resource(bucket, name, obj))
        result: dict[str, Any] = {"kind": "storage#objects"}
        if items:
            result["items"] = items
        if prefixes:
            result["prefixes"] = sorted(prefixes)
        return result


class _Handler(BaseHTTPRequestHandler):
    gcs: FakeGcs
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the server is quiet; `FakeGcs.log` has it all
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self.gcs.log.append(f"{method} {self.path}")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        # Split the raw path before unquoting: object names carry '/' as %2F.
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        try:
            self._route(method, parts, query, body)
        except _Error as e:
            self._json(e.code, {"error": {"code": e.code, "message": e.message, "errors": [_detail(e)]}})
        except Exception as e:  # a fake's bug: answer it rather than hang the client
            self._json(500, {"error": {"code": 500, "message": f"fake-gcs: {type(e).__name__}: {e}"}})

    def _route(self, method: str, parts: list[str], query: dict[str, str], body: bytes) -> None:
        gcs = self.gcs
        media = query.get("alt") == "media"
        if parts[:1] == ["download"]:  # the media download URL the client builds: /download/storage/v1/...
            parts, media = parts[1:], True
        match method, parts:
            case "GET", ["storage", "v1", "b", bucket]:
                self._json(200, gcs.get_bucket(bucket))
            case "POST", ["storage", "v1", "b"]:
                self._json(200, gcs.insert_bucket(json.loads(body or b"{}")))
            case "GET", ["storage", "v1", "b", bucket, "o"]:
                self._json(200, gcs.list_objects(bucket, query))
            case "GET", ["storage", "v1", "b", bucket, "o", name] if media:
                self._media(gcs.download(bucket, name, query))
            case "GET", ["storage", "v1", "b", bucket, "o", name]:
                self._json(200, gcs.get_object(bucket, name, query))
            case "DELETE", ["storage", "v1", "b", bucket, "o", name]:
                gcs.delete(bucket, name, query)
                self._reply(204, b"", {})
            case "POST", ["upload", "storage", "v1", "b", bucket, "o"] if (
                query.get("uploadType") == "multipart"
            ):
                metadata, data, content_type = self._multipart(body)
                name = str(metadata.get("name") or query.get("name") or "")
                if not name:
                    raise _Error(400, "required", "Required: the object's name")
                self._json(200, gcs.upload(bucket, name, data, content_type, query))
            case _:
                raise _Error(501, "notImplemented", f"fake-gcs does not implement {method} {self.path}")

    def _multipart(self, body: bytes) -> tuple[dict[str, Any], bytes, str]:
        """The metadata (JSON) and media parts of a multipart/related upload."""
        head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        parts = list(message.iter_parts())
        if not message.is_multipart() or len(parts) != 2:
            raise _Error(400, "invalid", "multipart upload: expected a metadata part and a media part")
        metadata = json.loads(_payload(parts[0]))
        content_type = str(metadata.get("contentType") or parts[1].get_content_type())
        return metadata, _payload(parts[1]), content_type

    def _media(self, obj: StoredObject) -> None:
        crc = google_crc32c.value(obj.data).to_bytes(4, "big")
        md5 = hashlib.md5(obj.data).digest()
        self._reply(
            200,
            obj.data,
            {
                "Content-Type": obj.content_type,
                "x-goog-generation": str(obj.generation),
                "x-goog-metageneration": "1",
                "x-goog-stored-content-length": str(len(obj.data)),
                "x-goog-stored-content-encoding": "identity",
                "x-goog-storage-class": "STANDARD",
                "x-goog-hash": f"crc32c={base64.b64encode(crc).decode()},md5={base64.b64encode(md5).decode()}",
                "ETag": base64.b64encode(str(obj.generation).encode()).decode(),
            },
        )

    def _json(self, code: int, payload: dict[str, Any]) -> None:
        self._reply(code, json.dumps(payload).encode(), {"Content-Type": "application/json; charset=UTF-8"})

    def _reply(self, code: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _detail(e: _Error) -> dict[str, str]:
    detail = {"domain": "global", "reason": e.reason, "message": e.message}
    if e.code == 412:
        detail |= {"locationType": "header", "location": "If-Match"}
    return detail


def _payload(part: Any) -> bytes:
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else str(payload).encode()


def client(fake: FakeGcs) -> storage.Client:
    """A google-cloud-storage Client that talks to `fake` with anonymous credentials."""
    return storage.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": fake.endpoint},
    )
