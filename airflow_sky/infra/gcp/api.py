"""The GCE calls the gcp infra makes, through the google-cloud-compute clients the google provider brings.

A thin boundary: resources go in and out as the REST API's JSON (dicts with camelCase keys), operations are
polled through zoneOperations/globalOperations with deadlines, and an operation or call that failed raises
GceError with GCE's error code (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED, ...), which the driver reads.
"""

from __future__ import annotations

import json
import time
from typing import Any

from google.api_core import exceptions as api_exceptions

from airflow_sky.errors import ClusterError


class GceError(ClusterError):
    """A GCE call or operation failed; `code` is GCE's error code or reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code


def _as_dict(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = type(message).to_dict(
        message, preserving_proto_field_name=False, use_integers_for_enums=False
    )
    return data


def _call_error(e: api_exceptions.GoogleAPICallError) -> GceError:
    reasons = [str(err.get("reason", "")) for err in (e.errors or []) if isinstance(err, dict)]
    message = str(e.message or e)
    code = next((r for r in reasons if r), "")
    for known in ("ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED"):
        if known in message:
            code = known
    if not code and e.code == 404:
        code = "notFound"
    if not code and e.code == 409:
        code = "alreadyExists"
    return GceError(code or f"HTTP {e.code}", message)


class ComputeApi:
    """GCE for one project. `credentials` from the google provider's hook (None: anonymous, emulators)."""

    def __init__(self, project: str, credentials: Any, endpoint: str | None = None) -> None:
        from google.cloud import compute_v1

        options = {"api_endpoint": endpoint} if endpoint else None
        kwargs: dict[str, Any] = {"credentials": credentials, "client_options": options}
        self.project = project
        self._instances = compute_v1.InstancesClient(**kwargs)
        self._firewalls = compute_v1.FirewallsClient(**kwargs)
        self._policies = compute_v1.ResourcePoliciesClient(**kwargs)
        self._zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self._region_ops = compute_v1.RegionOperationsClient(**kwargs)
        self._global_ops = compute_v1.GlobalOperationsClient(**kwargs)
        self._types = compute_v1
        self.poll_s = 2.0

    # ---- instances -------------------------------------------------------------------------------------

    def list_instances(self, zone: str, label: str, value: str) -> list[dict[str, Any]]:
        request = {"project": self.project, "zone": zone, "filter": f'labels.{label} = "{value}"'}
        try:
            return [_as_dict(i) for i in self._instances.list(request=request)]
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e

    def list_all_instances(self, label: str, value: str) -> list[dict[str, Any]]:
        """Every zone's instances with the label (one aggregated call: for a teardown that lost its record)."""
        request = {"project": self.project, "filter": f'labels.{label} = "{value}"'}
        found: list[dict[str, Any]] = []
        try:
            for _, scoped in self._instances.aggregated_list(request=request):
                found.extend(_as_dict(i) for i in scoped.instances)
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        return found

    def insert_instance(self, zone: str, body: dict[str, Any], request_id: str) -> str:
        """Start creating a VM; returns the operation's name. A retried insert (same request id) is a no-op."""
        instance = self._types.Instance.from_json(json.dumps(body), ignore_unknown_fields=True)
        try:
            op = self._instances.insert(
                request={
                    "project": self.project,
                    "zone": zone,
                    "instance_resource": instance,
                    "request_id": request_id,
                }
            )
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        return str(op.name)

    def start_instance(self, zone: str, name: str, request_id: str) -> str:
        try:
            op = self._instances.start(
                request={"project": self.project, "zone": zone, "instance": name, "request_id": request_id}
            )
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        return str(op.name)

    def delete_instance(self, zone: str, name: str, request_id: str) -> str | None:
        """Start deleting a VM; None when it is already gone."""
        try:
            op = self._instances.delete(
                request={"project": self.project, "zone": zone, "instance": name, "request_id": request_id}
            )
        except api_exceptions.NotFound:
            return None
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        return str(op.name)

    def guest_attributes(self, zone: str, name: str, query_path: str) -> list[dict[str, Any]]:
        try:
            found = self._instances.get_guest_attributes(
                request={"project": self.project, "zone": zone, "instance": name, "query_path": query_path}
            )
        except api_exceptions.GoogleAPICallError:
            return []  # not published yet (the guest environment starts after boot)
        items: list[dict[str, Any]] = _as_dict(found).get("queryValue", {}).get("items", [])
        return items

    def serial_output(self, zone: str, name: str) -> str:
        try:
            output = self._instances.get_serial_port_output(project=self.project, zone=zone, instance=name)
        except api_exceptions.GoogleAPICallError:
            return ""
        return str(output.contents or "")

    def preempted(self, zone: str) -> set[str]:
        """Names of VMs of `zone` that GCE preempted (its `compute.instances.preempted` operations)."""
        request = {
            "project": self.project,
            "zone": zone,
            "filter": 'operationType = "compute.instances.preempted"',
        }
        try:
            ops = [_as_dict(op) for op in self._zone_ops.list(request=request)]
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        return {str(op.get("targetLink", "")).rsplit("/", 1)[-1] for op in ops}

    def wait_zone_operation(self, zone: str, name: str, timeout_s: float) -> None:
        self._wait(
            lambda: self._zone_ops.get(project=self.project, zone=zone, operation=name), name, timeout_s
        )

    # ---- firewalls -------------------------------------------------------------------------------------

    def firewall(self, name: str) -> dict[str, Any] | None:
        try:
            return _as_dict(self._firewalls.get(project=self.project, firewall=name))
        except api_exceptions.NotFound:
            return None
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e

    def insert_firewall(self, body: dict[str, Any], timeout_s: float = 120) -> None:
        rule = self._types.Firewall.from_json(json.dumps(body), ignore_unknown_fields=True)
        try:
            op = self._firewalls.insert(project=self.project, firewall_resource=rule)
        except api_exceptions.Conflict:
            return  # made by a concurrent provisioner
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        self._wait(lambda: self._global_ops.get(project=self.project, operation=op.name), op.name, timeout_s)

    def update_firewall(self, name: str, body: dict[str, Any], timeout_s: float = 120) -> None:
        """Replace the rule (firewalls.update): what it allows becomes exactly `body`'s."""
        rule = self._types.Firewall.from_json(json.dumps(body), ignore_unknown_fields=True)
        try:
            op = self._firewalls.update(project=self.project, firewall=name, firewall_resource=rule)
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        self._wait(lambda: self._global_ops.get(project=self.project, operation=op.name), op.name, timeout_s)

    def delete_firewall(self, name: str, timeout_s: float = 120) -> None:
        try:
            op = self._firewalls.delete(project=self.project, firewall=name)
        except api_exceptions.NotFound:
            return
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        self._wait(lambda: self._global_ops.get(project=self.project, operation=op.name), op.name, timeout_s)

    # ---- resource policies (compact placement) -----------------------------------------------------------

    def resource_policy(self, region: str, name: str) -> dict[str, Any] | None:
        try:
            return _as_dict(self._policies.get(project=self.project, region=region, resource_policy=name))
        except api_exceptions.NotFound:
            return None
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e

    def insert_resource_policy(self, region: str, body: dict[str, Any], timeout_s: float = 120) -> None:
        policy = self._types.ResourcePolicy.from_json(json.dumps(body), ignore_unknown_fields=True)
        try:
            op = self._policies.insert(project=self.project, region=region, resource_policy_resource=policy)
        except api_exceptions.Conflict:
            return  # made by a concurrent provisioner of the same cluster
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        self._wait_region(region, op.name, timeout_s)

    def delete_resource_policy(self, region: str, name: str, timeout_s: float = 120) -> None:
        try:
            op = self._policies.delete(project=self.project, region=region, resource_policy=name)
        except api_exceptions.NotFound:
            return
        except api_exceptions.GoogleAPICallError as e:
            raise _call_error(e) from e
        self._wait_region(region, op.name, timeout_s)

    def _wait_region(self, region: str, name: str, timeout_s: float) -> None:
        self._wait(
            lambda: self._region_ops.get(project=self.project, region=region, operation=name), name, timeout_s
        )

    # ---- operations ------------------------------------------------------------------------------------

    def _wait(self, get: Any, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                op = _as_dict(get())
            except api_exceptions.GoogleAPICallError as e:
                raise _call_error(e) from e
            if op.get("status") == "DONE":
                errors = (op.get("error") or {}).get("errors") or []
                if errors:
                    raise GceError(str(errors[0].get("code", "")), str(errors[0].get("message", "")))
                return
            if time.monotonic() > deadline:
                raise GceError("TIMEOUT", f"operation {name} not done after {timeout_s:.0f} s")
            time.sleep(self.poll_s)
