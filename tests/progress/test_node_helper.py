"""airflow_sky.progress reaches every job on its node: a Python without airflow-sky imports the shipped copy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import poll_job, start_job
from airflow_sky.node.python_lib import job_python_files
from airflow_sky.progress import Report, ReportReader

# `python -S`: no site-packages, so the repo's venv (where airflow-sky is installed) is out of reach; what
# imports airflow_sky.progress is what the job's PYTHONPATH holds.
SCRIPT = r"""
set -eu
if env -u PYTHONPATH python -S -c 'import airflow_sky' 2>/dev/null; then
  echo "airflow_sky is importable without the shipped copy: the test proves nothing"; exit 3
fi
echo "PYTHONPATH=$PYTHONPATH"
python -S -c "from airflow_sky.progress import report; report(step=1, total=10, loss=0.5)"
python -S -c "import airflow_sky.progress as p; print('imported', p.__file__)"
"""


def _run(client: NodeClient, job_id: str, script: str, env: dict[str, str]) -> tuple[bytes, int | None]:
    start_job(client, job_id, script, env)
    data, offset = b"", 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        poll = poll_job(client, job_id, 0, offset)
        data, offset = data + poll.data, poll.next_offset
        if not poll.running and poll.caught_up:
            return data, poll.exit_code
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end: {data!r}")


def test_a_job_on_a_node_without_airflow_sky_reports_through_the_shipped_helper(local_cluster) -> None:
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        log, code = _run(
            client, "progress-helper", SCRIPT, {"PYTHONPATH": "/job/own/path", "SKYPILOT_NODE_RANK": "0"}
        )
        job_dir = client.exec('printf %s "$HOME/.airflow_sky/jobs/progress-helper"')[1].decode()
    text = log.decode()
    assert code == 0, text
    reader = ReportReader()
    reports = reader.feed(log) + reader.flush()
    assert [(r.step, r.total, dict(r.metrics), r.rank) for r in reports] == [(1, 10, {"loss": 0.5}, 0)], text
    # The shipped copy, from this generation's lib dir, after the job's own PYTHONPATH.
    assert f"imported {job_dir}/gen-0/lib/airflow_sky/progress/__init__.py" in text, text
    assert f"PYTHONPATH=/job/own/path:{job_dir}/gen-0/lib\n" in text, text


def test_a_node_where_airflow_sky_is_installed_imports_its_own(tmp_path: Path) -> None:
    # The shipped `airflow_sky` is a namespace portion: a regular package later on sys.path (site-packages
    # comes after PYTHONPATH) wins over it, so an installed airflow-sky is never shadowed by the copy.
    for path, data in job_python_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    installed = tmp_path / "site" / "airflow_sky"
    (installed / "progress").mkdir(parents=True)
    (installed / "__init__.py").write_text("KIND = 'installed'\n")
    (installed / "progress" / "__init__.py").write_text("")
    code = "import airflow_sky, airflow_sky.progress as p; print(airflow_sky.KIND, p.__file__)"
    env = {"PYTHONPATH": f"{tmp_path / 'lib'}:{tmp_path / 'site'}"}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"installed {installed / 'progress' / '__init__.py'}"


def test_the_shipped_files_are_the_whole_package_under_lib() -> None:
    files = job_python_files()
    package = Path(__file__).resolve().parents[2] / "airflow_sky" / "progress"
    assert sorted(files) == sorted(f"lib/airflow_sky/progress/{p.name}" for p in package.glob("*.py"))
    assert "lib/airflow_sky/__init__.py" not in files  # a namespace portion, see above
    assert files["lib/airflow_sky/progress/reporter.py"] == (package / "reporter.py").read_bytes()
    assert Report  # the parser the test reads reports with is the one shipped
