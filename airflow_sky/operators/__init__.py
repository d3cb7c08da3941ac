"""Thin Airflow operators for each phase of a job; the logic lives in SkyClusterHook and the job object
it hands out (airflow_sky.gang.gang_job.GangJob)."""

from airflow_sky.operators.collect import SkyCollectOperator
from airflow_sky.operators.launch import SkyLaunchOperator
from airflow_sky.operators.phase import SkyFollowOperator, SkyStartOperator
from airflow_sky.operators.provision import SkyProvisionOperator
from airflow_sky.operators.sync import SkySyncOperator
from airflow_sky.operators.teardown import SkyTeardownOperator

__all__ = [
    "SkyCollectOperator",
    "SkyFollowOperator",
    "SkyLaunchOperator",
    "SkyProvisionOperator",
    "SkyStartOperator",
    "SkySyncOperator",
    "SkyTeardownOperator",
]
