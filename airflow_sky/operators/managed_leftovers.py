"""The last teardown of a managed job run: what a cancel can leave of a local cluster after its teardown.

`jobs cancel` marks the run failed; Airflow kills its follow tasks while the job's teardown already runs.
A follow task writes its rank's last progress record (`state/progress/<job>/<rank>`) as it stops, which
can come after the teardown removed the cluster's folder, and so brings back `<cluster>/state/progress`.
Once such a folder (a local cluster's, holding no node) has been left alone for 10 s (hooks.leftovers), it is removed.
"""

from __future__ import annotations

import re
from typing import Any

from airflow.sdk import BaseOperator

from airflow_sky.hooks.leftovers import remove_leftover_clusters

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one path segment, never `..`


class SkyRemoveLeftoversOperator(BaseOperator):
    """Removes what the run's killed follow tasks wrote of a torn-down local cluster after its teardown
    (the module docstring; QUIET_S: hooks.leftovers). Reads the clusters from the spec tasks' XCom: only those that go down, on local."""

    ui_color = "#e8eaf6"

    def __init__(self, *, spec_task_ids: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_task_ids = spec_task_ids

    def execute(self, context: Any) -> None:
        specs = [context["ti"].xcom_pull(task_ids=task_id) for task_id in self.spec_task_ids]
        names = [
            str(spec["cluster_name"])
            for spec in specs
            if isinstance(spec, dict)
            and spec.get("down")
            and str(spec.get("infra") or "").split("/")[0] == "local"
            and isinstance(spec.get("cluster_name"), str)
            and _NAME.fullmatch(spec["cluster_name"])
            and ".." not in spec["cluster_name"]
        ]
        if names:
            remove_leftover_clusters(names, self.log.info)
