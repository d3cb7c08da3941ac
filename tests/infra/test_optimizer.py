"""The optimizer's choices, each checked against the catalog rows by hand.

The figures below are the rows of SkyPilot's catalog (the packaged copy of 2026-12-01), added up by hand:
for GCP a machine row plus the accelerator row of the same zone, for AWS the one row.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.infra import catalog
from airflow_sky.infra.optimizer import best_per_instance_type, plan
from airflow_sky.task import Resources


def _best(resources: Resources, nodes: int = 1, clouds: list[str] | None = None) -> tuple[str, str, float]:
    choice = plan(resources, nodes, clouds)[0]
    return choice.offering.instance_type, choice.infra, choice.cost


def test_the_catalog_is_packaged_with_its_source_and_date() -> None:
    assert catalog.meta()["as_of"] == "2026-12-01"
    assert len(catalog.offerings("aws")) == 3276  # every row of the AWS subset
    g2 = [
        o for o in catalog.offerings("gcp") if o.instance_type == "g2-standard-48" and o.zone == "us-east4-a"
    ]
    assert len(g2) == 1 and (g2[0].accelerator, g2[0].accelerator_count) == ("L4", 4)
    # g2-standard-48 in us-east4-a: VM 1.75574 + L4:4 2.23283; spot 0.70214 + 0.8932
    assert math.isclose(g2[0].price or 0, 1.75574 + 2.23283) and math.isclose(
        g2[0].spot_price or 0, 0.70214 + 0.8932
    )


def test_l4_4_on_two_nodes_is_gcps_g2_standard_48_and_on_aws_g6_12xlarge() -> None:
    instance, infra, cost = _best(Resources(accelerators="L4:4"), nodes=2)
    assert (instance, infra) == ("g2-standard-48", "gcp/us-east4/us-east4-a")
    assert math.isclose(cost, 2 * (1.75574 + 2.23283))
    instance, infra, cost = _best(Resources(accelerators="L4:4", infra="aws"), nodes=2)
    assert (instance, infra) == ("g6.12xlarge", "aws/us-east-1/use1-az1") and math.isclose(cost, 2 * 4.6016)


def test_a100_8_and_h100_8_take_the_cheapest_zone_of_the_gpu_machine_types() -> None:
    instance, infra, cost = _best(Resources(accelerators="A100:8"))
    assert (instance, infra) == ("a2-highgpu-8g", "gcp/europe-west4/europe-west4-a")
    assert math.isclose(cost, 6.51251 + 12.90919)
    instance, _, cost = _best(Resources(accelerators="A100:8", infra="aws"))
    assert instance == "p4d.24xlarge" and math.isclose(cost, 32.7726)
    instance, infra, cost = _best(Resources(accelerators="H100:8"))
    assert (instance, infra) == ("a3-highgpu-8g", "gcp/us-central1/us-central1-a")
    assert math.isclose(cost, 9.46006 + 33.60609)


def test_cpu_requests_use_the_general_purpose_families_with_skypilots_default() -> None:
    instance, infra, cost = _best(Resources(cpus="8+"))
    assert (instance, infra, cost) == ("n2-highcpu-8", "gcp/us-central1/us-central1-a", 0.28678)
    # No resources at all: 8+ vCPUs with 4 GiB each (m6i.2xlarge 0.384 beats n2-standard-8).
    instance, infra, cost = _best(Resources())
    assert (instance, infra, cost) == ("m6i.2xlarge", "aws/us-east-1/use1-az1", 0.384)
    instance, _, _ = _best(Resources(cpus=8, memory="64+", infra="aws"))
    assert instance == "r6i.2xlarge"


def test_spot_prices_are_used_and_zones_without_one_are_left_out() -> None:
    instance, infra, cost = _best(Resources(accelerators="L4:4", use_spot=True, infra="aws"))
    assert (instance, infra) == ("g6.12xlarge", "aws/ap-south-1/aps1-az1") and math.isclose(cost, 0.6452)
    choices = plan(Resources(accelerators="L4:4", use_spot=True), 1)
    assert all(c.use_spot and c.offering.spot_price is not None for c in choices)


def test_a_candidate_set_takes_the_cheapest_and_an_ordered_list_its_first_that_fits() -> None:
    instance, _, _ = _best(Resources(accelerators={"H100": 8, "A100": 8}))
    assert instance == "a2-highgpu-8g"  # A100:8 is cheaper than H100:8
    ordered = Resources(ordered=[{"accelerators": "H100:8"}, {"accelerators": "A100:8"}])
    assert _best(ordered)[0] == "a3-highgpu-8g"  # first in order, though dearer
    listed = Resources(accelerators=["H100:8", "A100:8"])  # a list is an order, as in SkyPilot
    assert _best(listed)[0] == "a3-highgpu-8g"
    assert listed.to_dict()["accelerators"] == ["H100:8", "A100:8"]
    assert Resources.from_dict(listed.to_dict()).accelerators_ordered
    any_of = Resources(any_of=[{"accelerators": "H100:8"}, {"accelerators": "A100:8", "infra": "aws"}])
    assert _best(any_of)[0] == "p4d.24xlarge"  # the cheaper of the two alternatives


def test_instance_type_region_zone_and_fractional_counts_narrow_the_choice() -> None:
    assert _best(Resources(instance_type="g6.12xlarge"))[0] == "g6.12xlarge"
    _, infra, _ = _best(Resources(accelerators="L4:4", infra="gcp/us-central1"))
    assert infra.startswith("gcp/us-central1/")
    _, infra, _ = _best(Resources(accelerators="L4:4", infra="aws/us-west-2/usw2-az2"))
    assert infra == "aws/us-west-2/usw2-az2"
    choice = plan(Resources(accelerators="T4:0.5"), 1)[0]
    assert (choice.offering.accelerator, choice.offering.accelerator_count) == ("T4", 1)


def test_one_row_per_instance_type_in_the_table() -> None:
    rows = best_per_instance_type(plan(Resources(accelerators="L4:4"), 2))
    assert len({(r.offering.cloud, r.offering.instance_type) for r in rows}) == len(rows)
    assert rows[0].offering.instance_type == "g2-standard-48"


def test_nothing_fits_names_the_closest_candidates() -> None:
    with pytest.raises(SpecError) as raised:
        plan(Resources(accelerators="A100:3"), 1)
    message = str(raised.value)
    assert "no instance in the aws/gcp catalog fits accelerators A100:3" in message
    assert "a2-highgpu-4g (A100:4)" in message and "p4d.24xlarge (A100:8)" in message


def _dryrun(task: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "airflow_sky.client.cli", "launch", str(task), *args, "--dryrun"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


def _l4_task(tmp_path: Path) -> Path:
    task = tmp_path / "task.yaml"
    task.write_text("name: ddp\nnum_nodes: 2\nresources:\n  accelerators: L4:4\nrun: echo\n")
    return task


def test_launch_dryrun_prints_skypilots_table_and_launches_nothing(tmp_path: Path) -> None:
    result = _dryrun(_l4_task(tmp_path), "--infra", "aws")
    for column in ("INFRA", "INSTANCE", "vCPUs", "Mem(GB)", "GPUS", "COST ($)", "CHOSEN"):
        assert column in result.stdout
    chosen = next(line for line in result.stdout.splitlines() if "✔" in line)
    assert "g6.12xlarge" in chosen and "9.20" in chosen and "L4:4" in chosen  # 2 x 4.6016
    assert "catalog of 2026-12-01" in result.stdout
    spot = _dryrun(_l4_task(tmp_path), "--infra", "aws", "--use-spot", "--region", "ap-south-1")
    chosen = next(line for line in spot.stdout.splitlines() if "✔" in line)
    assert "g6.12xlarge[Spot]" in chosen and "1.29" in chosen, spot.stdout  # 2 x 0.6452


def test_dryrun_on_any_cloud_compares_both_and_a_region_wildcard_narrows_it(tmp_path: Path) -> None:
    rows = [
        line for line in _dryrun(_l4_task(tmp_path), "--infra", "*").stdout.splitlines() if "L4:4" in line
    ]
    assert (
        rows[0].startswith("GCP (us-east4-a)") and "✔" in rows[0] and any(r.startswith("AWS") for r in rows)
    )
    rows = [
        line
        for line in _dryrun(_l4_task(tmp_path), "--infra", "*/us-east-1").stdout.splitlines()
        if "L4:4" in line
    ]
    assert rows and all(r.startswith("AWS (use1-") for r in rows)
