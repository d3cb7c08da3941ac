"""A node's own word of a preemption notice, held against the infra's.

On an infra that reports notices itself (local: NodeStatus.PREEMPTING), the watcher needs nothing from the
node. Where the cloud's API does not say (EC2 and GCE report a spot node RUNNING until it is taken), the node
learns of the notice from its metadata service and its job ends early on purpose (node.notice: SIGTERM, a
checkpoint, exit 143), which would read as a plain failure. So a fault on a node whose job dir holds a
notice file is held, and judged once the infra has spoken: the node gone within the cloud's notice window
(plus a grace) is a preemption with notice; still up after it, the fault is judged as it is.

The file is the job's to write, so it is never believed: it only makes the watcher wait, at most the
window, before the same judgement it would have made anyway. Nothing it holds is read as a number.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping

from airflow_sky.errors import RemoteError
from airflow_sky.infra.base import Node
from airflow_sky.infra.cluster import Cluster
from airflow_sky.node.client import FileTooLarge, NodeClient, UnsafeRemoteFile
from airflow_sky.node.notice import NOTICE_FILE
from airflow_sky.node.paths import JOBS_DIR

Fault = tuple[int, int | None, str]  # rank, its exit code (None: lost), the reason
GRACE_S = 30.0  # past the cloud's window: a cloud may take a little longer than it said


@dataclasses.dataclass(frozen=True)
class _Held:
    fault: Fault
    until: float  # monotonic
    since: float  # wall clock, when the fault was held


@dataclasses.dataclass(frozen=True)
class Settled:
    fault: Fault
    confirmed: bool  # the infra lost the node within the window: a preemption with notice
    since: float  # when the fault was first seen (wall clock)


class NoticeClaims:
    """Holds the first fault of a run generation whose node claims a notice until the infra settles it."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: Mapping[int, Node],
        remote_job: str,
        client: Callable[[int], NodeClient],
        log: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.remote_job = remote_job
        self.client = client
        self.log = log
        self.window_s = float(cluster.cloud.notice_window_s)
        self._held: _Held | None = None

    @property
    def holding(self) -> bool:
        return self._held is not None

    def hold(self, fault: Fault) -> bool:
        """Whether `fault` waits for the infra (then the watcher does nothing with it this round). While one
        is held, every later fault waits with it: the held one is judged first."""
        if self._held is not None:
            return True
        rank = fault[0]
        if self.window_s <= 0 or self.cluster.unhealthy_ranks([self.nodes[rank]]) or not self._claims(rank):
            return False
        self._held = _Held(fault, time.monotonic() + self.window_s + GRACE_S, time.time())
        self.log(
            f"rank {rank}: {fault[2]} after its node said a preemption notice came: waiting up to "
            f"{self.window_s + GRACE_S:.0f} s for the infra to take the node"
        )
        return True

    def settle(self) -> Settled | None:
        """The held fault once the infra spoke (or the window passed); None while it has not."""
        held = self._held
        if held is None:
            return None
        rank, code, reason = held.fault
        if self.cluster.unhealthy_ranks([self.nodes[rank]]):
            self._held = None
            return Settled((rank, code, f"{reason} after a preemption notice"), True, held.since)
        if time.monotonic() >= held.until:
            self._held = None
            self.log(
                f"rank {rank}: its node is still up past the notice window: judging its {reason} as it is"
            )
            return Settled(held.fault, False, held.since)
        return None

    def _claims(self, rank: int) -> bool:
        """Whether the rank's job dir holds a notice file (bounded read; any failure: no claim)."""
        with contextlib.suppress(RemoteError, UnsafeRemoteFile, FileTooLarge, OSError):
            return bool(self.client(rank).read_file(f"{JOBS_DIR}/{self.remote_job}/{NOTICE_FILE}", 256))
        return False
