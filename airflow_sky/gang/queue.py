"""The job queue of a cluster, kept on its head node (`~/.airflow_sky/queue/<id>/record.json`).

Job ids count 1, 2, 3, ... per cluster, like SkyPilot's. The queue lives on the cluster, not on an Airflow
worker, so any worker (and the CLI) sees the same jobs.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from typing import Any

from airflow_sky.errors import RemoteError
from airflow_sky.gang.job import JobStatus
from airflow_sky.node.client import NodeClient
from airflow_sky.node.paths import QUEUE_DIR


def allocate_command(submit_key: str) -> str:
    """Claim the next job id (mkdir is atomic), or print the id already claimed for `submit_key`."""
    key = hashlib.sha256(submit_key.encode()).hexdigest()[:32]
    return f"""\
set -eu
q="$HOME"/{QUEUE_DIR}
mkdir -p "$q/keys"
if [ -s "$q/keys/{key}" ]; then echo "existing $(cat "$q/keys/{key}")"; exit 0; fi
n=$(ls "$q" | grep -E '^[0-9]+$' | sort -n | tail -n 1 || true)
n=${{n:-0}}
n=$((n+1))
while ! mkdir "$q/$n" 2>/dev/null; do n=$((n+1)); done
echo "$n" > "$q/keys/{key}"
echo "new $n"
"""


def allocate_job(head: NodeClient, submit_key: str, record: dict[str, Any]) -> tuple[int, bool]:
    """A job id for `submit_key` (e.g. dag/run/group): a retried provision gets the same id back."""
    rc, out, err = head.exec(allocate_command(submit_key), timeout=60)
    words = out.decode().split()
    if rc != 0 or len(words) != 2 or not words[1].isdigit():
        raise RemoteError(
            f"could not allocate a job id on the head node: {err.decode(errors='replace').strip()}"
        )
    job_id, created = int(words[1]), words[0] == "new"
    if created:
        write_record(head, job_id, {**record, "job_id": job_id, "status": JobStatus.INIT.value})
    return job_id, created


def _record_path(job_id: int) -> str:
    return f"{QUEUE_DIR}/{int(job_id)}/record.json"


def write_record(head: NodeClient, job_id: int, record: dict[str, Any]) -> None:
    path = _record_path(job_id)
    tmp = f"{path}.tmp"
    with head.open_remote(tmp, "wb") as f:
        f.write(json.dumps(record, sort_keys=True).encode())  # one line: list_records reads lines
    head.rename(tmp, path)


def recreate_record(head: NodeClient, job_id: int) -> None:
    """An empty record for `job_id` on a head that lost its queue (a replaced head node)."""
    head.exec(f'mkdir -p "$HOME"/{QUEUE_DIR}/{int(job_id)}', timeout=60)
    write_record(head, job_id, {"job_id": job_id})


def read_record(head: NodeClient, job_id: int) -> dict[str, Any] | None:
    data = head.read_file(_record_path(job_id))
    return json.loads(data) if data else None


def update_record(head: NodeClient, job_id: int, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the record; `status` changes also stamp started_at / ended_at."""
    record = read_record(head, job_id) or {"job_id": job_id}
    status = fields.get("status")
    now = time.time()
    if status == JobStatus.SETTING_UP or status == JobStatus.RUNNING:
        record.setdefault("started_at", now)
    if status is not None and JobStatus(status).is_terminal:
        record.setdefault("ended_at", now)
    record.update({k: (v.value if isinstance(v, enum.Enum) else v) for k, v in fields.items()})
    write_record(head, job_id, record)
    return record


def list_records(head: NodeClient) -> list[dict[str, Any]]:
    """Every job record of the cluster, oldest first."""
    rc, out, err = head.exec(
        f'cd "$HOME"/{QUEUE_DIR} 2>/dev/null || exit 0; '
        'for d in $(ls | grep -E "^[0-9]+$" | sort -n); do [ -s "$d/record.json" ] && cat "$d/record.json" && echo; done; true',
        timeout=60,
    )
    if rc != 0:
        raise RemoteError(
            f"could not read the job queue on the head node: {err.decode(errors='replace').strip()}"
        )
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]
