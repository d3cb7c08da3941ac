"""Scripts as templates: Jinja renders `{{ ds }}` and leaves shell syntax that looks like Jinja alone."""

from __future__ import annotations

import jinja2
import pytest

from airflow_sky import Task
from airflow_sky.task.templating import as_literal, keep_literal, protect_shell_syntax


def render(template: str, **context: object) -> str:
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(**context)


@pytest.mark.parametrize(
    "script",
    [
        'ARR=(a b c); echo "${#ARR[@]}"',
        'echo "${#HOME} chars" # a comment',
        'echo "${#A}" "${#B}" #}',
    ],
)
def test_bash_lengths_survive_rendering(script):
    assert render(protect_shell_syntax(script) or "") == script


def test_templates_next_to_bash_lengths_still_render():
    script = 'echo "{{ ds }}: ${#ARR[@]} items"'
    assert (
        render(protect_shell_syntax(script) or "", ds="2026-11-30") == 'echo "2026-11-30: ${#ARR[@]} items"'
    )


@pytest.mark.parametrize(
    "text",
    [
        "docker ps --format '{{.Names}}'",
        "kubectl get pods -o jsonpath='{.items[*]}' {% not jinja %} {# nor this",
        "a script that mentions {% endraw %} and {{ x }}\nwith 'quotes' and \\backslashes and ünïcode",
        "no markers at all",
    ],
)
def test_literal_text_renders_to_itself(text):
    assert render(as_literal(text) or "") == text
    assert protect_shell_syntax(as_literal(text)) == as_literal(text)


def test_keep_literal_covers_scripts_envs_and_secrets():
    task = Task(
        setup="echo '{{ setup }}'",
        run="docker inspect --format '{{.State.Status}}' c; echo ${#X}",
        envs={"FMT": "{{.ID}}"},
        secrets={"TOKEN": "t{%k"},
    )
    keep_literal(task)
    assert render(task.setup or "") == "echo '{{ setup }}'"
    assert (
        render(protect_shell_syntax(task.run) or "")
        == "docker inspect --format '{{.State.Status}}' c; echo ${#X}"
    )
    assert render(task.envs["FMT"]) == "{{.ID}}"
    assert render(task.secrets["TOKEN"]) == "t{%k"
