"""The one table of infras. Optional clouds import lazily, with an install hint when their extra is missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from airflow_sky.errors import SpecError
from airflow_sky.infra.base import Cloud
from airflow_sky.infra.cluster import Cluster

# infra name -> (module, class, pip extra that provides its dependencies or None)
_DRIVERS: dict[str, tuple[str, str, str | None]] = {
    "local": ("airflow_sky.infra.local.cloud", "LocalCloud", None),
    "ssh": ("airflow_sky.infra.ssh.cloud", "SshCloud", None),
    "aws": ("airflow_sky.infra.aws.cloud", "AwsCloud", "aws"),
    "gcp": ("airflow_sky.infra.gcp.cloud", "GcpCloud", "gcp"),
}
# Infras whose `<cloud>/<location>` names something the driver needs (the pool), and the argument it goes in.
_LOCATION_ARGUMENT = {"ssh": "pool", "aws": "location", "gcp": "location"}
_LOCATION_REQUIRED = {"ssh"}
# Infras that need no credentials, so take no Airflow connection.
_NO_CONNECTION = {"local"}
# Infras set up through an Airflow connection: the module naming its default id (light: no cloud SDK).
_CONNECTION_SETTINGS = {"aws": "airflow_sky.infra.aws.settings", "gcp": "airflow_sky.infra.gcp.settings"}


def supported_infras() -> list[str]:
    return sorted(_DRIVERS)


def configured_infras() -> tuple[list[str], list[tuple[str, str]]]:
    """The infras to ask, local first (each ssh pool of the pool files, each cloud), and (what, why) for
    configuration that could not be read. A cloud is listed whether or not its connection exists."""
    from airflow_sky.infra.ssh.pools import pool_files, read_pool_file

    infras = ["local"]
    problems: list[tuple[str, str]] = []
    for name in supported_infras():
        if name == "ssh":
            pools: list[str] = []
            for path in pool_files():
                if not path.is_file():
                    continue
                try:
                    pools.extend(p for p in read_pool_file(path) if p not in pools)
                except SpecError as e:
                    problems.append(("ssh", str(e)))
                    break
            infras.extend(f"ssh/{pool}" for pool in pools)
        elif name != "local":
            infras.append(name)
    return infras, problems


def check_connection(infra: str, conn_id: str | None) -> None:
    """An infra that needs no credentials refuses a conn_id (rather than failing deep in its driver)."""
    cloud_name = (infra or "local").split("/", 1)[0].lower()
    if conn_id is not None and cloud_name in _NO_CONNECTION:
        raise SpecError(
            f"conn_id: the {cloud_name} infra takes no Airflow connection (it needs no credentials), "
            f"got conn_id={conn_id!r}; leave conn_id out"
        )


def default_conn_id(infra: str) -> str | None:
    """The Airflow connection `infra`'s driver uses by default (`aws_default`, ...); None when it takes none."""
    module = _CONNECTION_SETTINGS.get((infra or "local").split("/", 1)[0].lower())
    return str(importlib.import_module(module).DEFAULT_CONN_ID) if module else None


def get_cloud(infra: str, conn_id: str | None = None) -> Cloud:
    """The driver for `infra` (`local`, `ssh/<pool>`, `aws/<region>`, ...); only the cloud part selects it."""
    cloud_name = (infra or "local").split("/", 1)[0].lower()
    entry = _DRIVERS.get(cloud_name)
    if entry is None:
        raise SpecError(
            f"infra: unsupported cloud {cloud_name!r}; supported: {', '.join(supported_infras())}"
        )
    check_connection(cloud_name, conn_id)
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = f" (pip install 'airflow-sky[{extra}]')" if extra else ""
        raise SpecError(f"infra: {cloud_name} needs packages that are not installed{hint}: {e}") from e
    factory: Callable[..., Cloud] = getattr(module, class_name)
    kwargs: dict[str, str] = {} if conn_id is None else {"conn_id": conn_id}
    location = (infra or "local").split("/", 1)[1] if "/" in (infra or "") else ""
    if cloud_name in _LOCATION_ARGUMENT:
        if not location and cloud_name in _LOCATION_REQUIRED:
            raise SpecError(f"infra: {cloud_name} needs a pool name: {cloud_name}/<pool> (got {infra!r})")
        kwargs[_LOCATION_ARGUMENT[cloud_name]] = location
    return factory(**kwargs)


def open_cluster(cluster_name: str, infra: str | None = None, conn_id: str | None = None) -> Cluster:
    """The Cluster object for `cluster_name` on `infra` (local when not given); connects to nothing yet."""
    return Cluster(cluster_name, infra or "local", get_cloud(infra or "local", conn_id))
