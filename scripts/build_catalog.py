#!/usr/bin/env python3
"""Rebuild airflow-sky's packaged instance catalog from SkyPilot's public catalog CSVs.

    python scripts/build_catalog.py --aws AWS_VMS.csv --gcp GCP_VMS.csv --as-of 2026-12-01 \
        --source "skypilot-org/skypilot-catalog catalogs/v7 (aws 001367d2, gcp 017e2502)"

The inputs are SkyPilot's `catalogs/v7/aws/vms.csv` and `catalogs/v7/gcp/vms.csv` (or a subset of their
rows with the same header). The output, `airflow_sky/infra/catalog/data/{aws,gcp}.csv.gz` and `meta.json`,
has one row per offering — what one instance of a type costs in one zone — with the same columns for both
clouds:

    InstanceType, AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, Price, SpotPrice, Region, Zone

AWS rows are copied (GpuInfo dropped). GCP rows are combined the way SkyPilot prices them: a VM row's price
is the VM alone, so

- a2/a3/g2 machine types carry their GPUs (a2-highgpu-Ng = A100:N, g2-standard-48 = L4:4, ...): the offering
  is the VM row plus the accelerator row of that name and count in the same zone;
- attachable GPUs (T4, V100, P100, P4) go on an n1 host in the same zone: one offering per n1 machine type
  with at least 4 vCPUs and 16 GiB per GPU (SkyPilot's T4:1 default is 4 vCPUs, 16 GiB), VM plus GPU price;
- CPU-only VM rows are offerings as they are.

A spot price is given only where every part has one.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path

OUT_COLUMNS = [
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "Price",
    "SpotPrice",
    "Region",
    "Zone",
]
DATA_DIR = Path(__file__).resolve().parent.parent / "airflow_sky" / "infra" / "catalog" / "data"

# GCP machine types whose GPUs are built in (SkyPilot's mapping; it has none for a3-edgegpu).
_GCP_BUILT_IN = [
    (re.compile(r"^a2-highgpu-(\d+)g$"), "A100", None),
    (re.compile(r"^a2-megagpu-16g$"), "A100", 16),
    (re.compile(r"^a2-ultragpu-(\d+)g$"), "A100-80GB", None),
    (re.compile(r"^a3-highgpu-(\d+)g$"), "H100", None),
    (re.compile(r"^a3-megagpu-8g$"), "H100-MEGA", 8),
    (re.compile(r"^a3-ultragpu-8g$"), "H200", 8),
]
_G2_L4 = {"g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8}  # the others: 1
_GCP_ATTACHABLE = {"T4", "V100", "P100", "P4"}


def _gcp_built_in(machine: str) -> tuple[str, int] | None:
    if machine.startswith("g2-standard-"):
        return "L4", _G2_L4.get(machine, 1)
    for pattern, name, count in _GCP_BUILT_IN:
        match = pattern.match(machine.removesuffix("-nolssd"))
        if match:
            return name, count if count is not None else int(match.group(1))
    return None


def _num(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _sum(*parts: float | None) -> float | None:
    return None if any(p is None for p in parts) else round(sum(p for p in parts if p is not None), 6)


def aws_rows(path: Path) -> Iterable[dict[str, object]]:
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            yield {
                "InstanceType": row["InstanceType"],
                "AcceleratorName": row["AcceleratorName"],
                "AcceleratorCount": row["AcceleratorCount"],
                "vCPUs": row["vCPUs"],
                "MemoryGiB": row["MemoryGiB"],
                "Price": row["Price"],
                "SpotPrice": row["SpotPrice"],
                "Region": row["Region"],
                "Zone": row["AvailabilityZone"],
            }


def gcp_rows(path: Path) -> Iterable[dict[str, object]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    machines = [r for r in rows if r["InstanceType"]]
    gpus: dict[tuple[str, int, str], dict[str, str]] = {}
    for r in rows:
        if not r["InstanceType"] and r["AcceleratorName"]:
            key = (r["AcceleratorName"].upper(), int(float(r["AcceleratorCount"])), r["AvailabilityZone"])
            best = gpus.get(key)
            if best is None or (_num(r["Price"]) or 1e18) < (_num(best["Price"]) or 1e18):
                gpus[key] = r

    def offering(
        machine: dict[str, str], name: str, count: int | str, gpu: dict[str, str] | None
    ) -> dict[str, object]:
        return {
            "InstanceType": machine["InstanceType"],
            "AcceleratorName": name,
            "AcceleratorCount": count,
            "vCPUs": machine["vCPUs"],
            "MemoryGiB": machine["MemoryGiB"],
            "Price": _sum(_num(machine["Price"]), _num(gpu["Price"]) if gpu else 0.0) or "",
            "SpotPrice": _sum(_num(machine["SpotPrice"]), _num(gpu["SpotPrice"]) if gpu else 0.0) or "",
            "Region": machine["Region"],
            "Zone": machine["AvailabilityZone"],
        }

    for machine in machines:
        built_in = _gcp_built_in(machine["InstanceType"])
        if built_in is not None:
            name, count = built_in
            gpu = gpus.get((name.upper(), count, machine["AvailabilityZone"]))
            if gpu is not None:
                yield offering(machine, gpu["AcceleratorName"], count, gpu)
            continue
        if machine["InstanceType"].startswith(("a2-", "a3-")):
            continue  # a GPU machine without a GPU price in this zone (a3-edgegpu): not offered
        yield offering(machine, "", "", None)
        if machine["InstanceType"].startswith("n1-"):
            vcpus, memory = float(machine["vCPUs"]), float(machine["MemoryGiB"])
            for (name, count, zone), gpu in gpus.items():
                fits = vcpus >= 4 * count and memory >= 16 * count
                if name in _GCP_ATTACHABLE and zone == machine["AvailabilityZone"] and fits:
                    yield offering(machine, gpu["AcceleratorName"], count, gpu)


def write(rows: Iterable[dict[str, object]], path: Path) -> int:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, OUT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    count = 0
    for row in rows:
        writer.writerow(row)
        count += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same input gives the same bytes
        f.write(buffer.getvalue().encode())
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--aws", type=Path, required=True, help="SkyPilot's catalogs/v7/aws/vms.csv")
    parser.add_argument("--gcp", type=Path, required=True, help="SkyPilot's catalogs/v7/gcp/vms.csv")
    parser.add_argument("--as-of", required=True, help="the date the CSVs were read (YYYY-MM-DD)")
    parser.add_argument("--source", required=True, help="where the CSVs come from (repository, commits)")
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    counts = {
        "aws": write(aws_rows(args.aws), args.out / "aws.csv.gz"),
        "gcp": write(gcp_rows(args.gcp), args.out / "gcp.csv.gz"),
    }
    meta = {"as_of": args.as_of, "source": args.source, "offerings": counts}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {counts['aws']} AWS and {counts['gcp']} GCP offerings to {args.out}")


if __name__ == "__main__":
    main()
