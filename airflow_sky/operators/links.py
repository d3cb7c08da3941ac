"""The per-node extra link: the node's machine in its cloud's console (EC2, Compute Engine).

Airflow 3 evaluates an operator link in the worker when the task ends and keeps the URL as an XCom, which
the UI reads; the URL comes from the node record the infra wrote at provision time, so no cloud call is
made here. Infras without a console (local, ssh) have no URL and the UI shows the link disabled.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink


class SkyNodeConsoleLink(BaseOperatorLink):
    """`Node console`: the page of the task's node in its cloud's console."""

    name = "Node console"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        node = getattr(operator, "node", None)
        if isinstance(node, dict):
            return str(node.get("console_url") or "")
        return ""
