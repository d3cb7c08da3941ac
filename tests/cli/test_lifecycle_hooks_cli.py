"""Lifecycle hooks through the real CLI on a real local cluster: `stop` and `down` run the cluster's hooks
and print what they printed, `logs --hook` shows the kept runs, and a launch's own teardown (the DAG's
teardown task, `--down`) runs the down hooks with the job's secrets, hidden in its log."""

from __future__ import annotations

from pathlib import Path

from airflow_sky.infra.local.cloud import LocalCloud
from tests.cli.test_launch_cli import _cli, cli_env, launch_log  # noqa: F401 - the module's CLI environment

HOOKED = """\
name: hooked
envs:
  PROBE: {probe}
secrets:
  HOOK_SECRET: null
run: echo "trained" > "$PROBE/trained"
config:
  hooks:
    - run: |
        echo "hook saw $AIRFLOW_SKY_HOOK_EVENT with ${{HOOK_SECRET:-no secret}}"
        echo "$AIRFLOW_SKY_HOOK_EVENT ${{HOOK_SECRET:-none}}" >> "$PROBE/events"
    - run: sleep 120
      events: [stop]
      timeout: 1
"""


def test_stop_and_down_run_the_hooks_logs_hook_shows_them_and_a_launchs_teardown_passes_its_secret(
    cli_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    task = tmp_path / "hooked.yaml"
    task.write_text(HOOKED.format(probe=tmp_path))
    env = {**cli_env, "HOOK_SECRET": "pass-word-77"}
    launched = _cli(env, "launch", "-c", "hk", str(task), "-y", "--secret", "HOOK_SECRET")
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    stopped = _cli(env, "stop", "hk", "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    out = stopped.stdout
    # No task at hand: the hooks get the task's envs, never its secret (it was not stored anywhere).
    assert "(hook 1 stop, rank 0) hook saw stop with no secret" in out
    assert "WARNING: hook 2 (stop) on rank 0 ran out of its time" in out
    assert out.splitlines()[-1].startswith("Cluster hk stopped.")
    assert (tmp_path / "events").read_text() == "stop none\n"
    hooks = _cli(env, "logs", "hk", "--hook")
    assert hooks.returncode == 1, hooks.stdout + hooks.stderr  # the latest run had a hook that timed out
    assert "== stop hooks of job 1," in hooks.stdout
    assert "(hook 1, rank 0) exited 0 after" in hooks.stdout
    assert "(hook 1, rank 0) hook saw stop with no secret" in hooks.stdout
    assert "(hook 2, rank 0) ran out of its time" in hooks.stdout
    assert _cli(env, "start", "hk").returncode == 0
    downed = _cli(env, "down", "hk", "-y")
    assert downed.returncode == 0, downed.stdout + downed.stderr
    assert "(hook 1 down, rank 0) hook saw down with no secret" in downed.stdout
    assert "hook 2" not in downed.stdout  # a stop hook only
    assert "hk" not in LocalCloud().clusters()

    # A launch that takes its cluster down: the DAG's teardown runs the down hooks with the job's secret.
    (tmp_path / "events").unlink()
    once = _cli(env, "launch", "-c", "hk-once", str(task), "-y", "--down", "--secret", "HOOK_SECRET")
    assert once.returncode == 0, once.stdout[-3000:] + once.stderr[-3000:]
    assert (tmp_path / "events").read_text() == "down pass-word-77\n"
    log = launch_log(once.stdout)
    assert "(hook 1 down, rank 0) hook saw down with" in log
    assert "pass-word-77" not in log and "pass-word-77" not in once.stdout
    assert "hk-once" not in LocalCloud().clusters()
