"""The aws infra's StateStore: one DynamoDB table, an item per record, written by conditional puts.

The job records must outlive any node and must not live on an Airflow worker, so on AWS they live in a
DynamoDB table (`airflow-sky-state` by default, on-demand billing, created on first use). Partition key:
the cluster; sort key: the record's key. A write carries `version = :expected` (or "no item yet") as its
condition, so of two racing writers exactly one wins, and DynamoDB's conditional writes are strongly
consistent; reads are consistent reads. DynamoDB keeps no write time of its own, so a record is stamped
with DynamoDB's clock as its responses tell it (the `Date` header of the latest response, advanced by the
local monotonic clock since): leases are read on one clock, never against a worker's own.
"""

from __future__ import annotations

import json
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import ClientError

from airflow_sky.errors import ClusterError
from airflow_sky.infra.state_store import StateStore, Versioned, is_cluster_store, validate_key

_TABLE_READY_TIMEOUT_S = 120
_ready_tables: set[tuple[int, str]] = set()
_ready_lock = threading.Lock()


def ensure_table(client: Any, table: str) -> None:
    """Create the state table when it does not exist (idempotent; racing creators are fine)."""
    key = (id(client), table)
    with _ready_lock:
        if key in _ready_tables:
            return
    try:
        client.describe_table(TableName=table)
    except ClientError as e:
        if _code(e) != "ResourceNotFoundException":
            raise ClusterError(f"aws: cannot read the state table {table!r}: {e}") from e
        try:
            client.create_table(
                TableName=table,
                AttributeDefinitions=[
                    {"AttributeName": "cluster", "AttributeType": "S"},
                    {"AttributeName": "key", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "cluster", "KeyType": "HASH"},
                    {"AttributeName": "key", "KeyType": "RANGE"},
                ],
                BillingMode="PAY_PER_REQUEST",
                Tags=[{"Key": "airflow-sky", "Value": "state"}],
            )
        except ClientError as create_error:
            if _code(create_error) != "ResourceInUseException":
                raise ClusterError(f"aws: cannot create the state table {table!r}: {create_error}") from e
        client.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 2, "MaxAttempts": _TABLE_READY_TIMEOUT_S // 2}
        )
    with _ready_lock:
        _ready_tables.add(key)


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _server_time(response: dict[str, Any]) -> float | None:
    """The time in a response's `Date` header (whole seconds: the middle of that second), or None."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() + 0.5 if date else None
    except (TypeError, ValueError):
        return None


class DynamoDbStateStore(StateStore):
    """One cluster's records in the state table; `client` is a boto3 DynamoDB client."""

    def __init__(self, client: Any, table: str, cluster: str) -> None:
        self._client = client
        self.table = table
        self.cluster = cluster
        self._sample: tuple[float, float] | None = None  # (DynamoDB's time, local monotonic) of a response

    def _saw(self, response: dict[str, Any]) -> dict[str, Any]:
        server = _server_time(response)
        if server is not None:
            self._sample = (server, time.monotonic())
        return response

    def _server_now(self) -> float:
        """DynamoDB's clock now, from the latest response's date (a read when none was seen yet)."""
        if self._sample is None:
            self._saw(self._client.get_item(TableName=self.table, Key=self._item_key("clock")))
        if self._sample is None:
            raise ClusterError(f"aws: the state table {self.table!r} answered without a Date header")
        server, seen = self._sample
        return server + (time.monotonic() - seen)

    def now(self) -> float:
        self._ready()
        self._sample = None  # a fresh reading, not an estimate advanced from an old one
        return self._server_now()

    def _ready(self) -> None:
        ensure_table(self._client, self.table)

    def _item_key(self, key: str) -> dict[str, Any]:
        return {"cluster": {"S": self.cluster}, "key": {"S": validate_key(key)}}

    def get(self, key: str) -> Versioned | None:
        self._ready()
        response = self._client.get_item(TableName=self.table, Key=self._item_key(key), ConsistentRead=True)
        item = self._saw(response).get("Item")
        if not item:
            return None
        updated = item.get("updated", {}).get("N")
        return Versioned(
            int(item["version"]["N"]),
            json.loads(item["data"]["S"]),
            float(updated) if updated is not None else None,
        )

    def put(self, key: str, data: dict[str, Any], expected_version: int | None) -> Versioned | None:
        self._ready()
        version = (expected_version or 0) + 1
        condition: dict[str, Any]
        if expected_version is None:
            condition = {
                "ConditionExpression": "attribute_not_exists(#k)",
                "ExpressionAttributeNames": {"#k": "key"},
            }
        else:
            condition = {
                "ConditionExpression": "#v = :v",
                "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {":v": {"N": str(expected_version)}},
            }
        updated = round(self._server_now(), 3)
        item = self._item_key(key) | {
            "version": {"N": str(version)},
            "data": {"S": json.dumps(data, sort_keys=True)},
            "updated": {"N": str(updated)},
        }
        try:
            self._saw(self._client.put_item(TableName=self.table, Item=item, **condition))
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                return None
            raise
        return Versioned(version, data, updated)

    def keys(self, prefix: str) -> list[str]:
        self._ready()
        start = validate_key(prefix) + "/"
        found = []
        for item in self._query(start):
            rest = item["key"]["S"][len(start) :]
            if rest and "/" not in rest:
                found.append(item["key"]["S"])
        return sorted(found)

    def _query(self, begins_with: str) -> list[dict[str, Any]]:
        paginator = self._client.get_paginator("query")
        expression = "#c = :c" + (" AND begins_with(#k, :p)" if begins_with else "")
        values = {":c": {"S": self.cluster}} | ({":p": {"S": begins_with}} if begins_with else {})
        items: list[dict[str, Any]] = []
        for page in paginator.paginate(
            TableName=self.table,
            KeyConditionExpression=expression,
            ExpressionAttributeNames={"#c": "cluster", "#k": "key"} if begins_with else {"#c": "cluster"},
            ExpressionAttributeValues=values,
            ConsistentRead=True,
        ):
            items.extend(page.get("Items", []))
        return items

    def delete_all(self) -> None:
        """Remove every record of the cluster (its teardown)."""
        self._ready()
        for item in self._query(""):
            self._client.delete_item(
                TableName=self.table, Key={"cluster": item["cluster"], "key": item["key"]}
            )


def cluster_names(client: Any, table: str) -> list[str]:
    """Clusters with records in the table (a scan of keys only; small: a few items per cluster)."""
    ensure_table(client, table)
    names: set[str] = set()
    for page in client.get_paginator("scan").paginate(
        TableName=table, ProjectionExpression="#c", ExpressionAttributeNames={"#c": "cluster"}
    ):
        names.update(item["cluster"]["S"] for item in page.get("Items", []))
    return sorted(n for n in names if is_cluster_store(n))
