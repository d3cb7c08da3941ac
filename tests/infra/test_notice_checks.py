"""The aws and gcp notice checks (infra.notices), run by bash as a node runs them, against a stand-in for
each metadata service (tests/metadata_standin.py: no emulator has one)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from airflow_sky.infra import notices
from airflow_sky.infra.aws.cloud import AwsCloud
from airflow_sky.infra.gcp.cloud import GcpCloud
from tests.metadata_standin import MetadataStandIn, metadata_standin


@pytest.fixture()
def standin() -> Iterator[MetadataStandIn]:
    with metadata_standin() as server:
        yield server


def _run(check: str) -> str:
    return subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.parametrize(("check", "window"), [(notices.aws_check, 120), (notices.gcp_check, 30)])
def test_a_check_prints_nothing_until_the_notice_then_the_second_the_node_goes(
    standin, check, window
) -> None:
    assert _run(check(standin.url)) == ""
    standin.announce()
    printed = _run(check(standin.url))
    assert printed.isdigit() and abs(int(printed) - (time.time() + window)) <= 3


def test_a_notice_announced_once_reaches_only_the_first_node_that_asks(standin) -> None:
    standin.announce(once=True)
    assert _run(notices.aws_check(standin.url)) != "" and _run(notices.aws_check(standin.url)) == ""


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
