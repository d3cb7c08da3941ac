"""A stand-in for the clouds' instance metadata services, for the nodes' notice watchers (infra.notices):
neither moto nor the GCE fake has one. A loopback HTTP server that answers as the docs say:

- IMDSv2: `PUT /latest/api/token` (with a TTL header) gives a token; `GET
  /latest/meta-data/spot/instance-action` with it answers 404 until a spot interruption is scheduled.
- GCE: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google` answers FALSE or TRUE.

Every node of a test asks the same server, which cannot tell them apart: `announce(once=True)` answers the
notice to the first node that asks after it, and no notice to anyone after (each node's watcher acts on the
first notice it sees), so exactly one node is warned, as when the cloud takes one node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "tok-123"


class MetadataStandIn:
    def __init__(self) -> None:
        self.url = ""
        self._lock = threading.Lock()
        self._noticed = False
        self._once = False
        self.told = 0  # how many answers announced a notice

    def announce(self, once: bool = False) -> None:
        with self._lock:
            self._noticed, self._once = True, once

    def _tell(self) -> bool:
        with self._lock:
            if not self._noticed:
                return False
            self.told += 1
            if self._once:
                self._noticed = False
            return True


def _handler(standin: MetadataStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._answer(200, TOKEN)
            return self._answer(400, "")

        def do_GET(self) -> None:
            if self.path == "/latest/meta-data/spot/instance-action":
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    return self._answer(401, "")
                if not standin._tell():
                    return self._answer(404, "")
                return self._answer(200, '{"action": "terminate", "time": "2026-12-05T18:00:00Z"}')
            if self.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "")
                return self._answer(200, "TRUE" if standin._tell() else "FALSE")
            return self._answer(404, "")

        def _answer(self, code: int, body: str) -> None:
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def metadata_standin() -> Iterator[MetadataStandIn]:
    standin = MetadataStandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(standin))
    standin.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()


def warn_a_rank(standin: MetadataStandIn, probe: Path, deadline_s: float = 300) -> str | None:
    """Once both ranks of generation 0 are up (`up-<rank>-0` in `probe`), give the first node that asks a
    notice; return the rank whose job got SIGTERM (`sigterm-<rank>-0`), 3 s after it did (the worker holds
    the rank's exit meanwhile: the cloud still says the instance runs), or None by the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and not all((probe / f"up-{r}-0").exists() for r in "01"):
        time.sleep(0.2)
    standin.announce(once=True)  # the first node to ask gets the notice (each asks every few seconds)
    while time.monotonic() < deadline:
        warned = [r for r in "01" if (probe / f"sigterm-{r}-0").exists()]
        if warned:
            time.sleep(3)
            return warned[0]
        time.sleep(0.2)
    return None


def steps_by_generation(probe: Path, rank: int) -> dict[str, list[int]]:
    """The training steps rank `rank` wrote to `probe/steps-<rank>`, by generation."""
    by_generation: dict[str, list[int]] = {}
    for line in (probe / f"steps-{rank}").read_text().splitlines():
        generation, step = line.split()
        by_generation.setdefault(generation, []).append(int(step))
    return by_generation
