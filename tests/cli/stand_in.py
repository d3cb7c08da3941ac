"""A stand-in for the Airflow API on loopback (real sockets, real httpx): the tests' handlers answer canned
JSON through `answer_json`, and `serve` runs one for a test."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def answer_json(handler: BaseHTTPRequestHandler, body: Any, status: int = 200) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def serve(handler: type[BaseHTTPRequestHandler], **attributes: Any) -> Iterator[str]:
    """Serve a subclass of `handler` with `attributes` (what the test reads back) on a free port; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (handler,), attributes))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def jobs_queue(url: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """The real CLI's `jobs queue` against the stand-in at `url`, on a terminal `columns` wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_SKY_API")}
    env.update({"AIRFLOW_SKY_API_URL": url, "AIRFLOW_SKY_API_TOKEN": "t", "COLUMNS": str(columns)})
    return subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "jobs", "queue"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
