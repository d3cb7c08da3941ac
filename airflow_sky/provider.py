"""Airflow provider metadata (the apache_airflow_provider entry point)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    from airflow_sky import __version__

    # No "plugins" entry: the progress view's plugin is loaded through the `airflow.plugins` entry point
    # (pyproject.toml); naming it here too would register it twice (Airflow reports the second as an error).

    return {
        "package-name": "airflow-sky",
        "name": "airflow-sky",
        "description": "Run SkyPilot-style multi-node jobs (torchrun DDP, Ray, shell) as Airflow DAGs.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "airflow-sky",
                "external-doc-url": "https://docs.skypilot.co/",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": "airflow-sky", "python-modules": ["airflow_sky.operators"]}],
        "hooks": [{"integration-name": "airflow-sky", "python-modules": ["airflow_sky.hooks"]}],
        "triggers": [{"integration-name": "airflow-sky", "python-modules": ["airflow_sky.triggers"]}],
        "extra-links": ["airflow_sky.operators.links.SkyNodeConsoleLink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_sky.hooks.ssh_pool.SkySshPoolHook",
                "connection-type": "sky_ssh_pool",
            }
        ],
    }
