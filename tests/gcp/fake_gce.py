"""A stand-in for the GCE REST API (compute v1) that the google-cloud-compute clients talk to in the tests.

No GCE emulator exists. This server answers the calls the gcp infra makes with responses in the shapes
GCE documents for them (instances, zone and global operations, firewalls, guest attributes, the
`compute.instances.preempted` operation, error bodies); they are written after the API reference, not
captured from a live project. It keeps state, so a test sees operations go PENDING -> RUNNING -> DONE over
polls, VMs go PROVISIONING -> RUNNING, request ids make inserts idempotent, a zone can be out of stock
(the insert operation ends with ZONE_RESOURCE_POOL_EXHAUSTED), and a spot VM can be preempted (deleted,
with the preemption operation left behind). Resource policies (regional, with region operations) cannot be
deleted while a VM uses them, and a VM cannot name one that does not exist in its region; a VM's boot disk
is a disk resource of its own (type, labels, provisioned IOPS), deleted with it; firewalls can be replaced
(update); bad labels are refused as GCE refuses them.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.ports import free_port

_BASE = "/compute/v1/projects/"
_FILTER = re.compile(r'^\s*(?P<field>[\w.-]+)\s*=\s*"(?P<value>[^"]*)"\s*$')


class FakeGce:
    def __init__(self, project: str = "test-project") -> None:
        self.project = project
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.instances: dict[str, dict[str, Any]] = {}  # name -> instance JSON
        self.operations: dict[str, dict[str, Any]] = {}  # name -> operation JSON (+ "_polls")
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}  # "region/name" -> resource policy JSON
        self.disks: dict[str, dict[str, Any]] = {}  # name -> disk JSON (a VM's boot disk has its name)
        self.requests_seen: dict[str, str] = {}  # request id -> operation name
        self.stockout_zones: set[str] = set()
        self.guest_keys: dict[str, str] = {}  # vm name -> "ssh-ed25519 AAAA..." published as guest attributes
        self.inserts: list[str] = []  # names of inserts actually performed
        self._ips = itertools.count(2)
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())

    # ---- test controls ---------------------------------------------------------------------------------

    def start(self) -> FakeGce:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def preempt(self, name: str) -> None:
        """What GCE does to a spot VM whose termination action is DELETE."""
        with self.lock:
            vm = self.instances.pop(name)
            self.disks.pop(name, None)  # its boot disk is auto-deleted with it
            zone = vm["zone"].rsplit("/", 1)[-1]
            self._operation(zone, "compute.instances.preempted", vm["selfLink"], polls=0)

    def live(self, label_value: str) -> list[str]:
        with self.lock:
            return sorted(
                n
                for n, vm in self.instances.items()
                if vm["labels"].get("airflow-sky-cluster") == label_value
            )

    # ---- the API ---------------------------------------------------------------------------------------

    def policy_links(self) -> list[str]:
        with self.lock:
            return sorted(p["selfLink"] for p in self.policies.values())

    def _operation(
        self,
        zone: str | None,
        kind: str,
        target: str,
        polls: int = 1,
        error: dict[str, Any] | None = None,
        region: str | None = None,
    ) -> dict[str, Any]:
        name = f"operation-{uuid.uuid4().hex[:12]}"
        scope = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "PENDING",
            "selfLink": f"{self.endpoint}{_BASE}{self.project}/{scope}/operations/{name}",
            "_polls": polls,
        }
        if zone:
            op["zone"] = f"{self.endpoint}{_BASE}{self.project}/zones/{zone}"
        if region:
            op["region"] = f"{self.endpoint}{_BASE}{self.project}/regions/{region}"
        if error:
            op["_error"] = error
        if polls == 0:
            self._finish(op)
        self.operations[name] = op
        return op

    def _finish(self, op: dict[str, Any]) -> None:
        op["status"] = "DONE"
        if "_error" in op:
            op["error"] = {"errors": [op.pop("_error")]}
            op["httpErrorStatusCode"] = 503

    def _poll(self, name: str) -> dict[str, Any] | None:
        op = self.operations.get(name)
        if op is None:
            return None
        if op["status"] != "DONE":
            op["_polls"] -= 1
            op["status"] = "RUNNING"
            if op["_polls"] < 0:
                self._finish(op)
        return op

    def _insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> tuple[int, dict[str, Any]]:
        if request_id and request_id in self.requests_seen:
            return 200, self.operations[self.requests_seen[request_id]]
        name = body["name"]
        link = f"{self.endpoint}{_BASE}{self.project}/zones/{zone}/instances/{name}"
        if name in self.instances:
            return 409, _error(409, f"The resource '{link}' already exists", "alreadyExists")
        refused = self._refuse_instance(zone, body)
        if refused is not None:
            return refused
        if zone in self.stockout_zones:
            error = {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone '{zone}' does not have enough resources available to fulfill the request.",
            }
            op = self._operation(zone, "insert", link, error=error)
        else:
            n = next(self._ips)
            vm = {
                "kind": "compute#instance",
                "id": str(abs(hash(name)) % 10**18),
                "name": name,
                "zone": f"{self.endpoint}{_BASE}{self.project}/zones/{zone}",
                "machineType": body["machineType"],
                "status": "PROVISIONING",
                "labels": body.get("labels", {}),
                "tags": body.get("tags", {}),
                "scheduling": body.get("scheduling", {}),
                "metadata": body.get("metadata", {}),
                "guestAccelerators": body.get("guestAccelerators", []),
                "serviceAccounts": body.get("serviceAccounts", []),
                "creationTimestamp": f"2026-12-02T10:{n // 60 % 60:02d}:{n % 60:02d}.000-08:00",
                "networkInterfaces": self._interfaces(body, n),
                "resourcePolicies": [self._policy_link(zone, p) for p in body.get("resourcePolicies", [])],
                "disks": [self._boot_disk(zone, name, d) for d in body.get("disks", [])],
                "selfLink": link,
                "_boot_at": time.monotonic() + 0.3,
            }
            self.instances[name] = vm
            self.inserts.append(name)
            op = self._operation(zone, "insert", link)
        if request_id:
            self.requests_seen[request_id] = op["name"]
        return 200, op

    def _refuse_instance(self, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """What GCE answers 400/404 to at once: bad labels, a resource policy it cannot find in the region."""
        for key, value in (body.get("labels") or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key) or not re.fullmatch(
                r"[a-z0-9_-]{0,63}", value
            ):
                return 400, _error(400, f"Invalid value for field 'resource.labels': '{key}'", "invalid")
        for policy in body.get("resourcePolicies", []):
            if self._policy_key(zone, policy) not in self.policies:
                return 404, _error(404, f"The resource '{policy}' was not found", "notFound")
        return None

    @staticmethod
    def _policy_key(zone: str, policy: str) -> str:
        """ "region/name" of a policy a VM of `zone` names (a URL or relative path); its region must be the
        zone's."""
        match = re.search(r"regions/([^/]+)/resourcePolicies/([^/]+)$", policy)
        region, name = (match[1], match[2]) if match else (zone.rsplit("-", 1)[0], policy)
        return f"{region}/{name}" if region == zone.rsplit("-", 1)[0] else f"elsewhere/{name}"

    def _policy_link(self, zone: str, policy: str) -> str:
        return str(self.policies[self._policy_key(zone, policy)]["selfLink"])

    def _interfaces(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """The body's NICs as GCE shows them: the first with the cluster's addresses, the rest on their
        own networks (GPU NICs)."""
        nics = []
        for i, nic in enumerate(body.get("networkInterfaces") or [{}]):
            shown = {k: nic[k] for k in ("network", "subnetwork", "nicType") if k in nic}
            shown["name"] = f"nic{i}"
            shown["networkIP"] = f"10.128.0.{n}" if i == 0 else f"10.{129 + i}.0.{n}"
            if i == 0:
                shown["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "natIP": f"34.1.0.{n}"}]
            nics.append(shown)
        return nics

    def _boot_disk(self, zone: str, name: str, attached: dict[str, Any]) -> dict[str, Any]:
        params = attached.get("initializeParams") or {}
        disk_type = str(params.get("diskType", "pd-standard")).rsplit("/", 1)[-1]
        link = f"{self.endpoint}{_BASE}{self.project}/zones/{zone}/disks/{name}"
        self.disks[name] = {
            "name": name,
            "zone": f"{self.endpoint}{_BASE}{self.project}/zones/{zone}",
            "type": f"{self.endpoint}{_BASE}{self.project}/zones/{zone}/diskTypes/{disk_type}",
            "sizeGb": str(params.get("diskSizeGb", "10")),
            "labels": params.get("labels", {}),
            "selfLink": link,
            **({"provisionedIops": str(params["provisionedIops"])} if "provisionedIops" in params else {}),
        }
        return {
            "boot": bool(attached.get("boot")),
            "autoDelete": bool(attached.get("autoDelete")),
            "source": link,
        }

    def _policies(self, method: str, region: str, rest: list[str], body: dict[str, Any]) -> tuple[int, Any]:
        not_found = (404, _error(404, f"The resource '{'/'.join(rest)}' was not found", "notFound"))
        if method == "POST":
            key = f"{region}/{body['name']}"
            if key in self.policies:
                return 409, _error(409, "already exists", "alreadyExists")
            link = f"{self.endpoint}{_BASE}{self.project}/regions/{region}/resourcePolicies/{body['name']}"
            self.policies[key] = body | {"region": region, "selfLink": link, "status": "READY"}
            return 200, self._operation(None, "insert", link, region=region)
        key = f"{region}/{rest[0]}" if rest else ""
        if key not in self.policies:
            return not_found
        if method == "DELETE":
            link = self.policies[key]["selfLink"]
            users = [vm["name"] for vm in self.instances.values() if link in vm.get("resourcePolicies", [])]
            if users:
                message = f"The resource_policy resource '{link}' is already being used by '{users[0]}'"
                return 400, _error(400, message, "resourceInUseByAnotherResource")
            del self.policies[key]
            return 200, self._operation(None, "delete", link, region=region)
        return 200, self.policies[key]

    def _instance(self, name: str) -> dict[str, Any] | None:
        vm = self.instances.get(name)
        if vm is not None and vm["status"] == "PROVISIONING" and time.monotonic() >= vm["_boot_at"]:
            vm["status"] = "RUNNING"
        return vm

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(_public(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                body: dict[str, Any] = {}
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    body = json.loads(self.rfile.read(length) or b"{}")
                parts = url.path.removeprefix(_BASE).split("/")[1:]  # drop the project
                with fake.lock:
                    status, answer = fake._answer(method, parts, query, body)
                self._send(status, answer)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def do_PUT(self) -> None:
                self._route("PUT")

        return Handler

    def _answer(
        self, method: str, parts: list[str], query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any]:
        not_found = (404, _error(404, f"The resource '{'/'.join(parts)}' was not found", "notFound"))
        if parts[:1] == ["aggregated"] and parts[1:] == ["instances"]:
            field, value = _filter(query.get("filter", ""))
            scoped: dict[str, Any] = {}
            for vm in self.instances.values():
                self._instance(vm["name"])
                if _matches(vm, field, value):
                    key = "zones/" + vm["zone"].rsplit("/", 1)[-1]
                    scoped.setdefault(key, {"instances": []})["instances"].append(vm)
            return 200, {"items": scoped}
        if parts[:1] == ["global"]:
            kind, name = parts[1], parts[2] if len(parts) > 2 else None
            if kind == "operations" and name:
                op = self._poll(name)
                return (200, op) if op else not_found
            if kind == "firewalls":
                if method == "POST":
                    if body["name"] in self.firewalls:
                        return 409, _error(409, "already exists", "alreadyExists")
                    self.firewalls[body["name"]] = body
                    return 200, self._operation(None, "insert", body["name"])
                if name not in self.firewalls:
                    return not_found
                if method == "DELETE":
                    del self.firewalls[name]
                    return 200, self._operation(None, "delete", name)
                if method == "PUT":
                    self.firewalls[name] = body
                    return 200, self._operation(None, "update", name)
                return 200, self.firewalls[name]
            return not_found
        if parts[:1] == ["regions"] and len(parts) >= 3:
            region, kind, rest = parts[1], parts[2], parts[3:]
            if kind == "operations" and rest:
                op = self._poll(rest[0])
                return (200, op) if op else not_found
            if kind == "resourcePolicies":
                return self._policies(method, region, rest, body)
            return not_found
        if parts[:1] != ["zones"]:
            return not_found
        zone, kind, rest = parts[1], parts[2], parts[3:]
        if kind == "operations":
            if rest:
                op = self._poll(rest[0])
                return (200, op) if op else not_found
            field, value = _filter(query.get("filter", ""))
            ops = [
                op
                for op in self.operations.values()
                if op.get("zone", "").endswith(f"/zones/{zone}")
                and (field != "operationType" or op["operationType"] == value)
            ]
            return 200, {"items": ops}
        if kind != "instances":
            return not_found
        if not rest:
            if method == "POST":
                return self._insert(zone, body, query.get("requestId"))
            field, value = _filter(query.get("filter", ""))
            found = [
                vm
                for vm in list(self.instances.values())
                if vm["zone"].endswith(f"/zones/{zone}")
                and self._instance(vm["name"])
                and _matches(vm, field, value)
            ]
            return 200, {"items": found}
        vm = self._instance(rest[0])
        if vm is None:
            return not_found
        action = rest[1] if len(rest) > 1 else None
        if method == "DELETE":
            request_id = query.get("requestId")
            if request_id and request_id in self.requests_seen:
                return 200, self.operations[self.requests_seen[request_id]]
            del self.instances[rest[0]]
            for disk in vm.get("disks", []):
                if disk.get("autoDelete"):
                    self.disks.pop(str(disk["source"]).rsplit("/", 1)[-1], None)
            op = self._operation(zone, "delete", vm["selfLink"])
            if request_id:
                self.requests_seen[request_id] = op["name"]
            return 200, op
        if action == "start":
            vm["status"] = "PROVISIONING"
            vm["_boot_at"] = time.monotonic() + 0.3
            return 200, self._operation(zone, "start", vm["selfLink"])
        if action == "stop":
            vm["status"] = "TERMINATED"
            return 200, self._operation(zone, "stop", vm["selfLink"])
        if action == "getGuestAttributes":
            key = self.guest_keys.get(vm["name"])
            items = []
            if key:
                key_type, blob = key.split()[:2]
                items = [{"namespace": "hostkeys", "key": key_type, "value": blob}]
            return 200, {"queryPath": query.get("queryPath", ""), "queryValue": {"items": items}}
        if action == "serialPort":
            return 200, {"contents": "[    1.0] booting\n", "start": "0", "next": "18"}
        return 200, vm


def _filter(text: str) -> tuple[str | None, str | None]:
    match = _FILTER.match(text or "")
    return (match["field"], match["value"]) if match else (None, None)


def _matches(vm: dict[str, Any], field: str | None, value: str | None) -> bool:
    if field is None:
        return True
    if field.startswith("labels."):
        return vm.get("labels", {}).get(field.removeprefix("labels.")) == value
    return False


def _error(code: int, message: str, reason: str) -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def _public(body: Any) -> Any:
    """The JSON without the fake's own bookkeeping (keys starting with `_`)."""
    if isinstance(body, dict):
        return {k: _public(v) for k, v in body.items() if not k.startswith("_")}
    if isinstance(body, list):
        return [_public(v) for v in body]
    return body
