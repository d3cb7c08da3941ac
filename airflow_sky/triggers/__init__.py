"""Triggers for deferrable airflow-sky operators (they run in the Airflow triggerer)."""

from airflow_sky.triggers.follow import SkyFollowTrigger

__all__ = ["SkyFollowTrigger"]
