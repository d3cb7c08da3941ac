"""Thin Airflow operators for each phase of a job; the logic lives in hooks and airflow_sky.gang.follow."""

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
