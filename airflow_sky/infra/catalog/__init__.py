"""Instance types and prices of the clouds (AWS, GCP): what the optimizer chooses from.

Package data built by `scripts/build_catalog.py` from SkyPilot's public catalog (see `data/meta.json` for
the source and the date, shown by `airflow-sky launch --dryrun`): one row per offering, i.e. what one
instance of a type costs per hour in one zone, on demand and as spot. GCP rows already combine a VM's price
with its GPUs' (SkyPilot's rule), so both clouds read the same way.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import io
import json
from importlib import resources
from typing import Any

CATALOG_CLOUDS = ("aws", "gcp")


@dataclasses.dataclass(frozen=True)
class Offering:
    """One instance type in one zone, with its hourly prices (None where the catalog has none)."""

    cloud: str
    instance_type: str
    accelerator: str | None
    accelerator_count: int
    vcpus: float
    memory_gib: float
    region: str
    zone: str
    price: float | None
    spot_price: float | None

    def hourly(self, use_spot: bool) -> float | None:
        return self.spot_price if use_spot else self.price


def _float(text: str) -> float | None:
    return float(text) if text else None


@functools.cache
def offerings(cloud: str) -> tuple[Offering, ...]:
    """Every offering of `cloud` (`aws` or `gcp`), in catalog order."""
    raw = resources.files(__package__).joinpath("data", f"{cloud}.csv.gz").read_bytes()
    rows = csv.DictReader(io.StringIO(gzip.decompress(raw).decode()))
    return tuple(
        Offering(
            cloud=cloud,
            instance_type=row["InstanceType"],
            accelerator=row["AcceleratorName"] or None,
            accelerator_count=int(float(row["AcceleratorCount"] or 0)),
            vcpus=float(row["vCPUs"]),
            memory_gib=float(row["MemoryGiB"]),
            region=row["Region"],
            zone=row["Zone"],
            price=_float(row["Price"]),
            spot_price=_float(row["SpotPrice"]),
        )
        for row in rows
    )


@functools.cache
def meta() -> dict[str, Any]:
    """Where the catalog comes from and when it was read: {"as_of", "source", "offerings"}."""
    data: dict[str, Any] = json.loads(resources.files(__package__).joinpath("data", "meta.json").read_text())
    return data


@functools.cache
def accelerator_count(cloud: str, instance_type: str) -> int:
    """GPUs of one instance of `instance_type` (0 for a type the catalog does not list or has none)."""
    return next((o.accelerator_count for o in offerings(cloud) if o.instance_type == instance_type), 0)
