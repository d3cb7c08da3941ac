"""Finding a cluster that this machine's index (client/cluster_index.py) does not know: ask the infras.

The infras asked are the ones configured here: local always (first, and alone when it has the cluster:
no cloud call then); every pool of the ssh pool files; each cloud whose Airflow connection is defined
(aws_default, google_cloud_default), so that a machine that never set a cloud up sends it nothing. The
others are asked at once, each by the driver's own lookup (instance tags, the cluster's state records),
within one deadline. A name found on one infra is recorded again; the error when it is found nowhere, or
on several infras, names what was asked and what could not be.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from airflow_sky.client import cluster_index
from airflow_sky.errors import ClusterError
from airflow_sky.task.diagnostics import did_you_mean

if TYPE_CHECKING:  # the drivers load Airflow's providers: imported when an infra is asked
    from airflow_sky.infra.base import Cloud

SEARCH_TIMEOUT_S = 60.0  # an unreachable pool host or cloud endpoint is reported, not waited for
_REASON_CHARS = 200


class ClusterNotFound(ClusterError):
    """No infra configured here has the cluster."""


class AmbiguousCluster(ClusterError):
    """Several infras have a cluster of that name, and this machine has no record of which it means."""


class NotConfigured(Exception):
    """The infra is not set up on this machine (no connection, no packages): it is not asked."""


@dataclasses.dataclass(frozen=True)
class Search:
    cluster_name: str
    found: tuple[str, ...]  # the infras that have the cluster
    searched: tuple[str, ...]  # the infras asked that answered (found or not)
    not_searched: tuple[tuple[str, str], ...]  # (infra, why it could not be asked)


def candidate_infras() -> tuple[list[str], list[tuple[str, str]]]:
    """The infras to ask, local first, and (what, why) for configuration that could not be read."""
    from airflow_sky.infra.registry import configured_infras

    return configured_infras()


def configured_cloud(infra: str) -> Cloud:
    """The driver of `infra`; NotConfigured when it is not set up here (no connection, no extra)."""
    from airflow_sky.errors import SpecError
    from airflow_sky.infra.registry import default_conn_id, get_cloud

    # A cloud set up through an Airflow connection (a pool file: none) is asked only when it has one; that
    # is settled before its driver (and SDK: boto3, google) is imported.
    conn_id = default_conn_id(infra)
    if conn_id is not None:
        _require_connection(conn_id)
    try:
        return get_cloud(infra)
    except SpecError as e:  # the cloud's extra is not installed
        raise NotConfigured(str(e)) from e


def has_cluster(infra: str, cluster_name: str) -> bool:
    """Whether `infra` has nodes of `cluster_name`; NotConfigured when it is not set up here."""
    return bool(configured_cloud(infra).nodes(cluster_name))


def _require_connection(conn_id: str) -> None:
    from airflow_sky.client.connections import AskAirflow, defined_without_airflow

    try:
        if "airflow" in sys.modules:  # loaded already (a task, a launch): asking it costs nothing
            raise AskAirflow("Airflow is loaded")
        defined = defined_without_airflow(conn_id)
    except AskAirflow:
        defined = _airflow_has_connection(conn_id)
    if not defined:
        raise NotConfigured(f"no Airflow connection {conn_id!r}")


def _airflow_has_connection(conn_id: str) -> bool:
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # Airflow raises its own not-found types, which differ between contexts
        return False
    return True


def search(
    cluster_name: str,
    already_searched: Sequence[str] = (),
    probe: Callable[[str, str], bool] | None = None,
    timeout_s: float | None = None,
) -> Search:
    """Ask every configured infra but `already_searched` whether it has `cluster_name` (`probe` asks one
    infra: has_cluster unless given)."""
    probe = probe or has_cluster
    infras, problems = candidate_infras()
    answers: dict[str, bool | str] = {}
    asked = [i for i in infras if i not in already_searched]
    if "local" in asked:  # cheap, and where most clusters live: the clouds are asked only if it is not here
        asked.remove("local")
        answers["local"] = _ask(probe, "local", cluster_name)
    if answers.get("local") is not True:
        answers.update(_ask_all(probe, asked, cluster_name, timeout_s or SEARCH_TIMEOUT_S))
    found = tuple(i for i, a in answers.items() if a is True)
    searched = (*already_searched, *(i for i, a in answers.items() if isinstance(a, bool)))
    failed = tuple((i, a) for i, a in answers.items() if isinstance(a, str))
    return Search(cluster_name, found, searched, (*problems, *failed))


def _ask(probe: Callable[[str, str], bool], infra: str, cluster_name: str) -> bool | str:
    try:
        return probe(infra, cluster_name)
    except NotConfigured as e:
        return str(e)[:_REASON_CHARS]
    except Exception as e:  # an infra that cannot answer (unreachable host, refused credentials) is reported
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return first_line[:_REASON_CHARS]


def _ask_all(
    probe: Callable[[str, str], bool], infras: Sequence[str], cluster_name: str, timeout_s: float
) -> dict[str, bool | str]:
    answers: dict[str, bool | str] = {}
    lock = threading.Lock()

    def ask(infra: str) -> None:
        answer = _ask(probe, infra, cluster_name)
        with lock:
            answers[infra] = answer

    # Daemon threads: one that never returns (a host that accepts and then hangs) does not hold the exit.
    threads = [threading.Thread(target=ask, args=(i,), daemon=True, name=f"search-{i}") for i in infras]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return {i: answers.get(i, f"no answer within {timeout_s:.0f}s") for i in infras}


def known_cluster_names() -> list[str]:
    """The cluster names this machine knows without asking a cloud: its index and the local infra's."""
    from airflow_sky.infra.registry import get_cloud

    return sorted({*cluster_index.read_index(), *get_cloud("local").clusters()})


def not_found_message(result: Search, known: Iterable[str] = ()) -> str:
    """'cluster X not found (searched: ...)', a did-you-mean among `known` names, what was not searched."""
    searched = ", ".join(result.searched) or "nothing"
    message = f"cluster {result.cluster_name!r} not found (searched: {searched}){did_you_mean(result.cluster_name, known)}"
    if result.not_searched:
        message += "; not searched: " + "; ".join(f"{i} ({why})" for i, why in result.not_searched)
    return message


def ambiguous_message(result: Search) -> str:
    on = " and ".join(result.found)
    first = result.found[0]
    return (
        f"cluster {result.cluster_name!r} exists on {on}, and this machine has no record of which one it "
        f"launched; pick one with, e.g.: airflow-sky status --infra {first} {result.cluster_name} "
        "(which records it), then run the command again"
    )


def locate(cluster_name: str, already_searched: Sequence[str] = ()) -> str:
    """The infra that has `cluster_name` (recorded in the index again); a ClusterError naming the infras
    searched when none has it, or naming them when several do."""
    result = search(cluster_name, already_searched)
    if len(result.found) == 1:
        cluster_index.remember(cluster_name, result.found[0])
        return result.found[0]
    if result.found:
        raise AmbiguousCluster(ambiguous_message(result))
    raise ClusterNotFound(not_found_message(result, known_cluster_names()))
