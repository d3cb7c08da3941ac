"""Paths on a node, relative to its home (what SFTP and `cd "$HOME"` see), and the framework's places there."""

from __future__ import annotations

JOBS_DIR = ".airflow_sky/jobs"  # the job records: ~/.airflow_sky/jobs/<job_id>/
MOUNTS_DIR = ".airflow_sky/mounts"  # bucket mounts and their rclone config (node.rclone)
WORKDIR = "sky_workdir"  # SkyPilot's ~/sky_workdir: the synced workdir, where scripts run


def remote_path(path: str) -> str:
    """A node path as SFTP sees it: `~/x` -> `x`, `~` -> `.`; relative paths are under the home already."""
    if path == "~":
        return "."
    if path.startswith("~/"):
        return path[2:]
    return path
