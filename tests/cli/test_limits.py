"""A launch raises its own open-file limit to what its nodes need, up to the hard limit."""

from __future__ import annotations

import resource
import subprocess
import sys


def _in_child_with_soft_limit(soft: int, code: str) -> str:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return subprocess.run(
        [sys.executable, "-c", code], preexec_fn=lower, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_128_node_launch_raises_a_256_soft_limit_to_what_it_needs():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = _in_child_with_soft_limit(
        256,
        "import resource; from airflow_sky.client.limits import raise_open_file_limit as r; "
        "print(r(128), resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
    )
    from airflow_sky.client.limits import open_files_needed

    expected = min(open_files_needed(128), hard) if hard != resource.RLIM_INFINITY else open_files_needed(128)
    assert out == f"{expected} {expected}"


def test_a_higher_limit_the_user_set_is_kept():
    out = _in_child_with_soft_limit(
        5000, "from airflow_sky.client.limits import raise_open_file_limit as r; print(r(2))"
    )
    assert out == "5000"
