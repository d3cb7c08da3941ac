"""What runs on a node, over SSH: exec, file transfer, workdir sync and detached jobs."""

from airflow_sky.remote.client import NodeClient
from airflow_sky.remote.jobs import JobPoll, JobStart, kill_job, poll_job, read_xcom, start_job

__all__ = ["JobPoll", "JobStart", "NodeClient", "kill_job", "poll_job", "read_xcom", "start_job"]
