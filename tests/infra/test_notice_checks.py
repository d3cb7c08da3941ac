"""The aws and gcp notice checks (infra.notices), run by bash as a node runs them, against a stand-in for
each metadata service (no emulator has one: a loopback HTTP server that answers as the docs say)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_sky.infra import notices
from airflow_sky.infra.aws.cloud import AwsCloud
from airflow_sky.infra.gcp.cloud import GcpCloud

TOKEN = "tok-123"


class _Metadata(BaseHTTPRequestHandler):
    """IMDSv2 (a PUT for a token, then GETs that carry it) and GCE's metadata (its header required)."""

    noticed = False

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._answer(200, TOKEN)
        return self._answer(400, "")

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return self._answer(401, "")
            if not self.noticed:
                return self._answer(404, "")
            return self._answer(200, '{"action": "terminate", "time": "2026-12-05T18:00:00Z"}')
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403, "")
            return self._answer(200, "TRUE" if self.noticed else "FALSE")
        return self._answer(404, "")

    def _answer(self, code: int, body: str) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def metadata() -> Iterator[tuple[str, type[_Metadata]]]:
    handler = type("Handler", (_Metadata,), {"noticed": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()


def _run(check: str) -> str:
    return subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.parametrize(("check", "window"), [(notices.aws_check, 120), (notices.gcp_check, 30)])
def test_a_check_prints_nothing_until_the_notice_then_the_second_the_node_goes(
    metadata, check, window
) -> None:
    base, handler = metadata
    assert _run(check(base)) == ""
    handler.noticed = True
    printed = _run(check(base))
    assert printed.isdigit() and abs(int(printed) - (time.time() + window)) <= 3


def test_an_unreachable_metadata_service_is_no_notice() -> None:
    for check in (notices.aws_check("http://127.0.0.1:9"), notices.gcp_check("http://127.0.0.1:9")):
        assert _run(check) == ""


def test_the_clouds_give_their_check_the_deployments_metadata_url_and_their_window(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__SKY__METADATA_URL", "http://127.0.0.1:8111/")
    assert "http://127.0.0.1:8111/latest/meta-data/spot/instance-action" in (
        AwsCloud.notice_check(None, "c") or ""
    )  # type: ignore[arg-type]
    assert "http://127.0.0.1:8111/computeMetadata/v1/instance/preempted" in (
        GcpCloud.notice_check(None, "c") or ""
    )  # type: ignore[arg-type]
    assert (AwsCloud.notice_window_s, AwsCloud.notice_interval_s, GcpCloud.notice_window_s) == (
        120.0,
        5.0,
        30.0,
    )
