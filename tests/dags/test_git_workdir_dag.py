"""A git workdir end to end: sky_job under `airflow dags test` clones a private repository (GIT_TOKEN) on both
nodes at the commit its provision pinned, and the provision's `handle` XCom names that commit."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_sky.infra.local import daemon
from tests.gitserver import serve_repo

TOKEN = "e2e-token-5d1c0b-never-shown"

RUN = """\
head=$(git rev-parse HEAD)
echo "rank $SKYPILOT_NODE_RANK runs $head"
echo "$head" > "$PROBE_DIR/head-$SKYPILOT_NODE_RANK"
python3 train.py
"""


def _dag(url: str, ref: str, probe: Path) -> str:
    return f"""
import json
from airflow.sdk import DAG, task
from airflow_sky import Task, sky_job

sky_task = Task(
    name="gitwd",
    num_nodes=2,
    workdir={{"url": {url!r}, "ref": {ref!r}}},
    secrets={{"GIT_TOKEN": {TOKEN!r}}},
    envs={{"PROBE_DIR": {str(probe)!r}}},
    run={RUN!r},
)
with DAG("gitwd", schedule=None) as dag:
    group = sky_job(sky_task, cluster_name="gitwd-c")

    @task
    def keep_handle(ti=None):
        handle = ti.xcom_pull(task_ids="gitwd.provision", key="handle")
        open({str(probe / "handle.json")!r}, "w").write(json.dumps(handle))

    group >> keep_handle()
"""


def test_both_ranks_run_the_pinned_commit_of_a_private_repository(run_dag, tmp_path: Path):
    probe = tmp_path / "probe"
    probe.mkdir()
    with serve_repo(tmp_path / "git", token=TOKEN) as repo:
        repo.commit({"train.py": "print('trained on main')\n"})
        commit = repo.commit({"train.py": "print('trained on the release branch')\n"}, branch="release")
        result = run_dag("gitwd", _dag(repo.url, "release", probe))
    assert result.returncode == 0, result.digest
    assert [(probe / f"head-{rank}").read_text().strip() for rank in (0, 1)] == [commit, commit]
    assert json.loads((probe / "handle.json").read_text())["git_commit"] == commit
    assert f"workdir: {repo.url} at release -> commit {commit}" in result.output
    for rank in (0, 1):
        assert f"cloned {repo.url} at release ({commit}) -> ~/sky_workdir on rank {rank}" in result.output
        assert f"rank {rank} runs {commit}" in result.output
    assert "trained on the release branch" in result.output
    assert TOKEN not in result.output
    assert daemon.processes_with_marker("gitwd-c") == []
