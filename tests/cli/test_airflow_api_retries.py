"""The CLI's REST client rides out a busy Airflow API server instead of failing the command.

The server is a small HTTP server on loopback (real sockets, real httpx) whose answers the test scripts: a late
answer, a dropped request, a 503, a conflict after a late answer. A real Airflow cannot be made slow on cue.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_sky.client.airflow_api import AirflowApi, ApiConfig, ApiError


class Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next scripted (delay_s, status) for its path; records what it got."""

    script: dict[str, list[tuple[float, int]]]
    seen: list[tuple[str, str]]
    created: set[str]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.seen.append((self.command, self.path))
        delay, status = self.script[self.path].pop(0) if self.script.get(self.path) else (0.0, 200)
        if self.command == "POST" and status == 200:
            key = str(body.get("dag_run_id"))
            status = 409 if key in self.created else 200
            self.created.add(key)
        time.sleep(delay)
        payload = json.dumps({"detail": "exists"} if status == 409 else {"ok": True}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on this late answer

    do_GET = _answer
    do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[Scripted]]]:
    handler = type("Handler", (Scripted,), {"script": {}, "seen": [], "created": set()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def _api(url: str) -> AirflowApi:
    # A short timeout stands for a long answer: the late answers below take longer than it.
    return AirflowApi(ApiConfig(url, token="t"), timeout_s=0.5)


def test_a_late_answer_is_asked_again_and_the_second_answer_is_used(server):
    url, handler = server
    handler.script["/api/v2/dags/d"] = [(3.0, 200)]
    assert _api(url).get("/dags/d") == {"ok": True}
    assert handler.seen.count(("GET", "/api/v2/dags/d")) == 2


def test_a_server_error_is_asked_again_until_it_answers(server):
    url, handler = server
    handler.script["/api/v2/dags/d"] = [(0.0, 503), (0.0, 502)]
    assert _api(url).get("/dags/d") == {"ok": True}
    assert handler.seen.count(("GET", "/api/v2/dags/d")) == 3


def test_a_run_created_by_a_post_that_timed_out_is_not_a_conflict_when_posted_again(server):
    url, handler = server
    handler.script["/api/v2/dags/d/dagRuns"] = [(3.0, 200)]  # created, answered too late
    _api(url).request("POST", "/dags/d/dagRuns", json={"dag_run_id": "sky-job-1"})
    assert handler.seen.count(("POST", "/api/v2/dags/d/dagRuns")) == 2
    assert handler.created == {"sky-job-1"}


def test_a_conflict_without_a_lost_answer_is_still_an_error(server):
    url, _ = server
    api = _api(url)
    api.request("POST", "/dags/d/dagRuns", json={"dag_run_id": "sky-job-2"})
    with pytest.raises(ApiError, match="409") as error:
        api.request("POST", "/dags/d/dagRuns", json={"dag_run_id": "sky-job-2"})
    assert error.value.status_code == 409


def test_a_server_that_never_answers_in_time_is_one_error_naming_the_request(server):
    url, handler = server
    handler.script["/api/v2/dags/d"] = [(3.0, 200)] * 4
    with pytest.raises(ApiError, match=r"GET /dags/d: cannot reach the Airflow API at http://127\.0\.0\.1"):
        _api(url).get("/dags/d")
    assert handler.seen.count(("GET", "/api/v2/dags/d")) == 4


def test_a_refused_connection_is_not_tried_again():
    with pytest.raises(ApiError, match="cannot reach the Airflow API"):
        # Port 9 (discard) is closed on loopback: nothing listens, so nothing is worth waiting for.
        AirflowApi(ApiConfig("http://127.0.0.1:9"), timeout_s=0.5, attempts=1_000_000)
