"""The gcp state store against a fake of GCS's JSON API (tests/gcp/fake_gcs.py) that honours preconditions."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.gcp.state_store import GcsStateStore, cluster_names, ensure_bucket
from airflow_sky.infra.state_store import Versioned
from tests.gcp.fake_gcs import FakeGcs, client

PREFIX = "airflow-sky/clusters"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGcs]:
    server = FakeGcs().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(fake: FakeGcs) -> str:
    name = f"state-{uuid.uuid4().hex[:8]}"
    fake.add_bucket(name)
    return name


def store(fake: FakeGcs, bucket: str, cluster: str = "c1") -> GcsStateStore:
    return GcsStateStore(client(fake), bucket, cluster)


def test_records_are_written_only_at_the_version_read(fake: FakeGcs, bucket: str) -> None:
    s = store(fake, bucket)
    assert s.get("jobs/1") is None
    first = s.put("jobs/1", {"status": "INIT"}, None)
    assert first is not None and s.put("jobs/1", {"status": "X"}, None) is None  # exists
    second = s.put("jobs/1", {"status": "RUNNING"}, first.version)
    assert second is not None and second.version != first.version
    assert s.put("jobs/1", {"status": "LOST"}, first.version) is None  # a stale writer loses
    assert s.get("jobs/1") == second
    assert s.keys("jobs") == ["jobs/1"]


def test_the_version_is_the_objects_generation_and_the_record_its_json(fake: FakeGcs, bucket: str) -> None:
    written = store(fake, bucket).put("jobs/7", {"b": 2, "a": 1}, None)
    obj = fake.objects[(bucket, f"{PREFIX}/c1/jobs/7.json")]
    assert written == Versioned(obj.generation, {"b": 2, "a": 1})
    assert obj.data == json.dumps({"a": 1, "b": 2}).encode() and obj.content_type == "application/json"


@pytest.mark.parametrize("creating", [True, False], ids=["creating", "updating"])
def test_of_writers_racing_at_one_version_exactly_one_wins(
    fake: FakeGcs, bucket: str, creating: bool
) -> None:
    expected = None if creating else store(fake, bucket).put("jobs/1", {"n": -1}, None)
    version = None if expected is None else expected.version
    writers = 8
    stores = [store(fake, bucket) for _ in range(writers)]  # a client each, as separate workers have
    start = threading.Barrier(writers)
    results: list[Versioned | None] = [None] * writers

    def write(i: int) -> None:
        start.wait()
        results[i] = stores[i].put("jobs/1", {"n": i}, version)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert store(fake, bucket).get("jobs/1") == winners[0]


def test_a_read_racing_a_write_returns_the_data_of_the_version_it_returns(
    fake: FakeGcs, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(fake, bucket)
    first = s.put("jobs/1", {"status": "INIT"}, None)
    assert first is not None
    real_get_blob = s._bucket.get_blob
    raced: list[Versioned | None] = []

    def get_blob_then_a_writer_gets_in(name: str, **kwargs: Any) -> Any:
        found = real_get_blob(name, **kwargs)
        if not raced:  # between the metadata and the download, another writer replaces the record
            raced.append(store(fake, bucket).put("jobs/1", {"status": "RUNNING"}, first.version))
        return found

    monkeypatch.setattr(s._bucket, "get_blob", get_blob_then_a_writer_gets_in)
    got = s.get("jobs/1")
    assert raced[0] is not None and got == raced[0]
    assert got == Versioned(got.version, {"status": "RUNNING"}) and got.version != first.version


def test_keys_lists_one_level_only(fake: FakeGcs, bucket: str) -> None:
    s = store(fake, bucket)
    for key in ("jobs/2", "jobs/1", "jobs/1/steps/a", "other/x"):
        assert s.put(key, {}, None) is not None
    assert s.keys("jobs") == ["jobs/1", "jobs/2"]
    assert s.keys("jobs/1/steps") == ["jobs/1/steps/a"]
    assert s.keys("jobs/1") == []
    assert s.keys("nothing") == []
    assert store(fake, bucket, "c2").keys("jobs") == []


def test_delete_all_removes_only_that_clusters_records(fake: FakeGcs, bucket: str) -> None:
    mine, other = store(fake, bucket, "c1"), store(fake, bucket, "c10")  # one name prefixes the other
    for s in (mine, other):
        s.put("jobs/1", {"x": 1}, None)
        s.put("jobs/1/steps/a", {"x": 2}, None)
    mine.delete_all()
    assert mine.get("jobs/1") is None and mine.keys("jobs") == []
    assert [name for b, name in fake.objects if b == bucket] == [
        f"{PREFIX}/c10/jobs/1.json",
        f"{PREFIX}/c10/jobs/1/steps/a.json",
    ]
    mine.delete_all()  # nothing left: a no-op


def test_a_record_written_again_after_delete_all_is_at_a_new_version(fake: FakeGcs, bucket: str) -> None:
    s = store(fake, bucket)
    first = s.put("jobs/1", {"status": "INIT"}, None)
    assert first is not None
    s.delete_all()
    again = s.put("jobs/1", {"status": "INIT"}, None)
    assert again is not None and again.version != first.version
    assert s.put("jobs/1", {"status": "LOST"}, first.version) is None  # a writer from before the teardown


def test_cluster_names_lists_the_clusters_with_records(fake: FakeGcs, bucket: str) -> None:
    c = client(fake)
    assert cluster_names(c, bucket) == []
    for cluster in ("zeta", "alpha", "alpha2"):
        store(fake, bucket, cluster).put("jobs/1/steps/a", {}, None)
    assert cluster_names(c, bucket) == ["alpha", "alpha2", "zeta"]
    store(fake, bucket, "zeta").delete_all()
    assert cluster_names(c, bucket) == ["alpha", "alpha2"]


def test_ensure_bucket_creates_the_bucket_once_with_uniform_access(fake: FakeGcs) -> None:
    name = f"state-{uuid.uuid4().hex[:8]}"

    def requests() -> list[str]:  # this bucket's (clients also fetch other buckets' metadata in background)
        found = [r.split("?")[0] for r in fake.log]
        return [r for r in found if r.endswith(f"/b/{name}") or r == "POST /storage/v1/b"]

    c = client(fake)
    before = len(requests())
    ensure_bucket(c, name, "us-central1")
    ensure_bucket(c, name, "us-central1")  # cached for this client: no request
    assert requests()[before:] == [f"GET /storage/v1/b/{name}", "POST /storage/v1/b"]
    ensure_bucket(client(fake), name, "us-central1")  # another client finds it
    assert requests()[before:] == [
        f"GET /storage/v1/b/{name}",
        "POST /storage/v1/b",
        f"GET /storage/v1/b/{name}",
    ]
    created = fake.buckets[name]
    assert created["location"] == "US-CENTRAL1"
    assert created["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"] is True
    assert store(fake, name).put("jobs/1", {}, None) is not None


def test_ensure_bucket_accepts_a_creator_that_got_there_first(
    fake: FakeGcs, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = client(fake)
    monkeypatch.setattr(c, "lookup_bucket", lambda name, **kwargs: None)  # created after this lookup
    ensure_bucket(c, bucket, "us-central1")  # the insert answers 409: fine


def test_a_missing_bucket_is_a_cluster_error_naming_it(fake: FakeGcs) -> None:
    name = f"missing-{uuid.uuid4().hex[:8]}"
    s = store(fake, name)
    for call in (
        lambda: s.put("jobs/1", {}, None),
        lambda: s.keys("jobs"),
        lambda: cluster_names(client(fake), name),
    ):
        with pytest.raises(ClusterError, match=f"gcp: the state bucket '{name}' does not exist") as e:
            call()
        assert "\n" not in str(e.value)
    assert s.get("jobs/1") is None  # a read cannot tell a missing bucket from a missing record
    s.delete_all()  # a missing bucket holds nothing to remove


def test_a_forbidden_bucket_is_a_cluster_error_naming_it(fake: FakeGcs, bucket: str) -> None:
    s = store(fake, bucket)
    assert s.put("jobs/1", {}, None) is not None
    fake.forbid(bucket)
    try:
        for call in (
            lambda: s.get("jobs/1"),
            lambda: s.put("jobs/1", {}, None),
            lambda: s.keys("jobs"),
            lambda: s.delete_all(),
            lambda: cluster_names(client(fake), bucket),
            lambda: ensure_bucket(client(fake), bucket, "us-central1"),
        ):
            with pytest.raises(ClusterError, match=f"gcp: no access to the state bucket '{bucket}'") as e:
                call()
            assert "\n" not in str(e.value)
    finally:
        fake.allow(bucket)


def test_keys_must_be_valid(fake: FakeGcs, bucket: str) -> None:
    with pytest.raises(ValueError, match="invalid state key"):
        store(fake, bucket).put("../escape", {}, None)
