"""The Airflow plugin: the progress app in the API server, "Training progress" in the UI, and the "Sky"
fleet page in its navigation.

Airflow 3 finds it through the `airflow.plugins` entry point (pyproject.toml). The external views'
`{DAG_ID}`, `{RUN_ID}`, `{TASK_ID}` and `{MAP_INDEX}` are filled in by the UI; on a task instance page the
map index of a task mapped over the job's nodes is the node rank, which the page highlights.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_sky.ui.app import URL_PREFIX, app

VIEW = f"{URL_PREFIX}/progress/{{DAG_ID}}/{{RUN_ID}}"


class SkyProgressPlugin(AirflowPlugin):
    name = "airflow_sky"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "airflow-sky progress"}]
    external_views = [
        {
            # The fleet: every cluster, job and dollar (a nav entry of its own; the page is an iframe).
            "name": "Sky",
            "href": f"{URL_PREFIX}/fleet",
            "destination": "nav",
            "url_route": "sky_fleet",
            "nav_top_level": True,
        },
        {
            "name": "Training progress",
            "href": VIEW,
            "destination": "dag_run",
            "url_route": "sky_progress_run",
        },
        {
            "name": "Training progress",
            "href": f"{VIEW}?task_id={{TASK_ID}}&map_index={{MAP_INDEX}}",
            "destination": "task_instance",
            "url_route": "sky_progress_task",
        },
    ]
