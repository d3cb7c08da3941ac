"""`config.hooks` as SkyPilot's lifecycle-hooks reference defines it: parsed, defaulted, refused clearly."""

from __future__ import annotations

import warnings

import pytest

from airflow_sky import Task
from airflow_sky.errors import SpecError
from airflow_sky.task.hooks import DEFAULT_TIMEOUT_S, EVENTS, LifecycleHook, for_event, hook_env, parse_hooks


def _task(hooks: object) -> Task:
    return Task.from_dict({"run": "echo hi", "config": {"hooks": hooks}})


def test_a_hook_runs_on_every_event_for_an_hour_unless_it_says_otherwise() -> None:
    (hook,) = _task([{"run": "git push"}]).hooks
    assert hook == LifecycleHook(run="git push", events=EVENTS, timeout=DEFAULT_TIMEOUT_S)
    assert EVENTS == ("stop", "preemption", "down") and DEFAULT_TIMEOUT_S == 3600


def test_hooks_keep_their_order_and_each_event_runs_only_its_own() -> None:
    hooks = _task(
        [
            {"run": "a", "events": ["down", "stop", "down"], "timeout": 5},
            {"run": "b", "events": ["preemption"]},
            {"run": "c"},
        ]
    ).hooks
    assert hooks[0].events == ("stop", "down") and hooks[0].timeout == 5  # each event once
    assert [h.run for h in for_event(hooks, "down")] == ["a", "c"]
    assert [h.run for h in for_event(hooks, "preemption")] == ["b", "c"]
    assert [h.run for h in for_event(hooks, "stop")] == ["a", "c"]


def test_hooks_are_acted_on_so_no_inert_field_warning_names_them() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Task.from_dict({"run": "x", "config": {"hooks": [{"run": "y"}]}})
    with pytest.warns(UserWarning, match="config.somethingelse"):
        Task.from_dict({"run": "x", "config": {"hooks": [{"run": "y"}], "somethingelse": 1}})


@pytest.mark.parametrize(
    ("hooks", "message"),
    [
        ("echo", "config.hooks: must be a list of hooks"),
        (["echo"], r"config.hooks\[0\]: must be a mapping \{run, events, timeout\}, got str"),
        ([{"events": ["down"]}], r"config.hooks\[0\].run: required"),
        ([{"run": "  "}], r"config.hooks\[0\].run: required, a non-empty shell script"),
        (
            [{"run": "x"}, {"run": "y", "events": ["reboot"]}],
            r"config.hooks\[1\].events\[0\]: 'reboot' is no event",
        ),
        ([{"run": "x", "events": []}], r"config.hooks\[0\].events: must be a non-empty list"),
        ([{"run": "x", "events": "down"}], r"config.hooks\[0\].events: must be a non-empty list"),
        (
            [{"run": "x", "timeout": 0}],
            r"config.hooks\[0\].timeout: must be a whole number of seconds >= 1, got 0",
        ),
        ([{"run": "x", "timeout": "60"}], r"config.hooks\[0\].timeout: .* got '60'"),
        ([{"run": "x", "timeout": True}], r"config.hooks\[0\].timeout: .* got True"),
        (
            [{"run": "x", "when": "down"}],
            r"config.hooks\[0\]: unknown field 'when'; a hook has run, events, timeout",
        ),
    ],
)
def test_a_wrong_hook_is_refused_at_load_time_naming_its_field(hooks: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _task(hooks)


def test_a_wrong_hook_in_a_yaml_file_names_the_file(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("run: x\nconfig:\n  hooks:\n    - run: y\n      timeout: -1\n")
    with pytest.raises(SpecError, match=r"t\.yaml: config.hooks\[0\].timeout"):
        Task.from_yaml(str(path))


def test_no_config_or_no_hooks_means_none() -> None:
    assert Task(run="x").hooks == () and parse_hooks(None) == ()
    assert Task.from_dict({"run": "x", "config": {"docker": {}}}).hooks == ()


def test_a_hook_sees_the_task_envs_the_clusters_skypilot_vars_and_its_event() -> None:
    env = hook_env({"GREETING": "hi"}, ["10.0.0.1", "10.0.0.2"], 1, '{"cluster_name": "c"}', "sky-1", "down")
    assert env["GREETING"] == "hi" and env["SKYPILOT_NODE_RANK"] == "1"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2" and env["SKYPILOT_NUM_NODES"] == "2"
    assert env["SKYPILOT_TASK_ID"] == "sky-1" and env["AIRFLOW_SKY_HOOK_EVENT"] == "down"
    # The cluster's values win over an env of the same name: a hook must know where it runs.
    assert hook_env({"SKYPILOT_NODE_RANK": "9"}, ["a"], 0, "{}", "t", "stop")["SKYPILOT_NODE_RANK"] == "0"
