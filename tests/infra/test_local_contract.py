"""The Cloud contract run against the embedded local infra."""

from __future__ import annotations

import pytest

from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud
from tests.infra.contract import CloudContract


class _ServerNeverReady(LocalCloud):
    """Fault injection: the third node 'never comes up', so provisioning fails after two nodes started."""

    def _wait(self, node_dirs):  # type: ignore[no-untyped-def]
        if len(node_dirs) >= 3:
            daemon.kill_marked(daemon.marker(node_dirs[2].parent.parent.name, node_dirs[2].name))
            self.ready_timeout_s = 1.0
            # Wait for a ready file no server writes: on a loaded machine the kill above can land before the
            # node's process exists, and the node then comes up after all.
            node_dirs = [*node_dirs[:2], node_dirs[2].with_name(f"{node_dirs[2].name}-never")]
        super()._wait(node_dirs)


class TestLocalCloud(CloudContract):
    @pytest.fixture
    def cloud(self) -> LocalCloud:
        return LocalCloud()

    @pytest.fixture
    def failing_cloud(self) -> LocalCloud:
        return _ServerNeverReady()

    def leftovers(self, cluster_name: str) -> list[object]:
        return [*daemon.processes_with_marker(cluster_name), *layout.cluster_dir(cluster_name).glob("*")]
