"""Which infra a cluster lives on: the local index's hint (client.cluster_index), else a search of every
infra configured here (client.cluster_search); the infra itself is the source of truth."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_sky.client import cluster_index, ssh_config
from airflow_sky.client.engine import bind_private_home

if TYPE_CHECKING:  # loads Airflow, which engine.prepare_airflow must configure first
    from airflow_sky.infra.cluster import Cluster


def remember(cluster_name: str, infra: str | None) -> None:
    cluster_index.remember(cluster_name, infra)


def forget(cluster_name: str) -> None:
    """Drop what this machine keeps of a cluster that is gone: its ssh entries and infra hint."""
    ssh_config.remove_entries(cluster_name)
    remember(cluster_name, None)


def infra_of(cluster_name: str, infra: str | None = None) -> str:
    return infra or cluster_index.infra_hint(cluster_name) or "local"


def cluster_of(cluster_name: str, infra: str | None = None) -> Cluster:
    """The cluster `cluster_name` on the infra it was launched on (or `infra`). A name the local index
    does not know is looked for on every infra configured here (client/cluster_search.py)."""
    bind_private_home()
    from airflow_sky.client.cluster_search import locate
    from airflow_sky.infra.registry import open_cluster

    return open_cluster(cluster_name, infra or cluster_index.infra_hint(cluster_name) or locate(cluster_name))
