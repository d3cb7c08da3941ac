"""A run acts on its node's preemption notice (real local nodes, the local metadata stand-in): the job sees
the notice file, the preemption hooks run in order with the job's env, then the job gets SIGTERM and can
checkpoint; the infra reports the node PREEMPTING until it goes. Without a notice nothing changes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow_sky.infra.base import NodeStatus
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import poll_job, read_job, start_job
from airflow_sky.node.notice import NoticeWatch

# Checkpoints on SIGTERM, as a training loop should: its step and whether it saw the notice file.
TRAINER = """\
trap 'echo "checkpoint at step $step notice=$(cat "$AIRFLOW_SKY_JOB_DIR/notice" 2>/dev/null | wc -c)" > "$PROBE/ckpt-$R"; exit 143' TERM
step=0
while :; do step=$((step + 1)); echo "$step" > "$PROBE/step-$R"; sleep 0.2; done
"""

HOOKS = (
    'echo "first hook sees $GREETING ($AIRFLOW_SKY_HOOK_EVENT)"; echo 1 >> "$PROBE/hooks-$R"',
    'echo 2 >> "$PROBE/hooks-$R"; exit 5',
    "sleep 100",
)


def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_a_notice_runs_the_preemption_hooks_then_sigterms_the_job_which_checkpoints(
    local_cluster, tmp_path: Path
) -> None:
    name, nodes, key = local_cluster(2)
    cloud = LocalCloud()
    watch = NoticeWatch(check=cloud.notice_check(name) or "", hook_timeouts=(60, 60, 1), interval_s=0.2)
    env = {"PROBE": str(tmp_path), "GREETING": "hi"}
    clients = [NodeClient(n, key) for n in nodes]
    try:
        for node, client in zip(nodes, clients, strict=True):
            started = start_job(
                client,
                "7-run",
                TRAINER,
                {**env, "R": str(node.rank)},
                0,
                notice=watch,
                preemption_hooks=HOOKS,
            )
            assert started.started
        _wait(lambda: all((tmp_path / f"step-{r}").exists() for r in (0, 1)), 30, "both ranks train")
        noticed = cloud.notify_preemption(name, 1, window_s=60)
        assert noticed.status is NodeStatus.PREEMPTING and noticed.preempt_at is not None
        assert [n.status for n in cloud.nodes(name)] == [NodeStatus.RUNNING, NodeStatus.PREEMPTING]
        _wait(lambda: read_job(clients[1], "7-run", 0, 0).exit_code is not None, 30, "rank 1 ends")
        assert read_job(clients[1], "7-run", 0, 0).exit_code == 143
        assert (tmp_path / "hooks-1").read_text() == "1\n2\n"  # in order; the failing one did not stop them
        assert (tmp_path / "ckpt-1").read_text().startswith("checkpoint at step ")
        assert not (tmp_path / "ckpt-1").read_text().endswith("notice=0\n")  # the job could see the notice
        notice = json.loads(clients[1].read_file(".airflow_sky/jobs/7-run/notice") or b"{}")
        assert int(notice["preempt_at"]) == int(noticed.preempt_at) and notice["seen_at"] <= time.time()
        log = read_job(clients[1], "7-run", 0, 0).data.decode()
        assert "[airflow-sky] preemption notice: this node goes in" in log
        assert "(preemption hook 1) first hook sees hi (preemption)" in log
        assert "(preemption hook 2) exited 5" in log and "(preemption hook 3) exited 124" in log
        assert (
            clients[1].read_file(".airflow_sky/jobs/7-run/gen-0/hooks/preemption-2.rc", 64).split()[0] == b"5"
        )
        # The rank without a notice trains on, untouched.
        assert poll_job(clients[0], "7-run", 0, 0).running and not (tmp_path / "ckpt-0").exists()
        assert not (tmp_path / "hooks-0").exists()
    finally:
        for client in clients:
            client.close()
