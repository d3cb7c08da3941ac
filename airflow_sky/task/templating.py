"""Shell scripts as Airflow templates: `{{ ds }}` renders, shell syntax that looks like Jinja does not.

In a DAG, a task's setup, run, envs and secrets are Jinja templates (`{{ ds }}`, `{{ params.lr }}`). Two
things keep that from breaking ordinary scripts:

- `${#ARR[@]}` and `${#VAR}` (bash lengths) contain `{#`, which Jinja reads as the start of a comment: the
  template would fail to render, or swallow the script up to the next `#}`. They are escaped before
  rendering (protect_shell_syntax).
- A task run from the CLI (`airflow-sky launch task.yaml`) is a SkyPilot task, not a template: a
  `docker ps --format '{{.Names}}'` in it must reach the node as written. The CLI marks every templated
  field literal (keep_literal). Only `{{ sky_result('job') ... }}` expressions, an earlier pipeline job's
  result, are rendered first (render_results).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError
from jinja2.sandbox import SandboxedEnvironment

from airflow_sky.errors import SpecError

if TYPE_CHECKING:
    from airflow_sky.task import Task

_SHELL_LENGTH = "${#"
_SHELL_LENGTH_AS_JINJA = "${{ '{#' }}"  # renders back to `${#`
_RAW_OPEN, _RAW_CLOSE = "{% raw %}", "{% endraw %}"
_JINJA_MARKERS = ("{{", "{%", "{#")


def protect_shell_syntax(script: str | None) -> str | None:
    """The script with shell syntax that Jinja would misread escaped, so rendering leaves it as written."""
    if script is None or _SHELL_LENGTH not in script or _is_literal(script):
        return script
    return script.replace(_SHELL_LENGTH, _SHELL_LENGTH_AS_JINJA)


def as_literal(text: str | None) -> str | None:
    """`text` wrapped so that Jinja renders it to itself (unchanged when it has nothing Jinja would read)."""
    if text is None or not any(marker in text for marker in _JINJA_MARKERS) or _is_literal(text):
        return text
    if "endraw" in text:
        # A raw block cannot hold its own end tag: print the text from an expression instead.
        return "{{ " + repr(text) + " }}"
    return _RAW_OPEN + text + _RAW_CLOSE


def keep_literal(task: Task) -> Task:
    """Make every templated field of `task` render to itself (the CLI runs SkyPilot tasks, not templates);
    edits `task` in place and returns it."""
    return _edit_templated_fields(task, as_literal)


_SKY_RESULT = re.compile(r"\{\{\s*sky_result\s*\(.*?\}\}", re.DOTALL)


def render_results(task: Task, results: Mapping[str, Any]) -> Task:
    """Render each `{{ sky_result('job') ... }}` in `task`'s scripts, envs and secrets from `results`
    ({job id: result}, the earlier jobs of a pipeline run outside Airflow's templating); the rest of the
    text stays as written. A job without a result renders as None, as in a DAG. Edits `task` in place and
    returns it."""
    from airflow_sky.task.pipeline import job_id_for

    environment = SandboxedEnvironment()

    def sky_result(job: str) -> Any:
        return results.get(job_id_for(job))

    def render(text: str | None) -> str | None:
        if text is None or "sky_result" not in text:
            return text

        def one(match: re.Match[str]) -> str:
            try:
                return environment.from_string(match.group(0)).render(sky_result=sky_result)
            except TemplateError as e:
                raise SpecError(f"{task.name or 'task'}: cannot render {match.group(0)!r}: {e}") from e

        return _SKY_RESULT.sub(one, text)

    return _edit_templated_fields(task, render)


def _edit_templated_fields(task: Task, edit: Callable[[str | None], str | None]) -> Task:
    """`edit` applied, in place, to each of `task.template_fields`: a script, or each value of envs/secrets."""
    for name in task.template_fields:
        value = getattr(task, name)
        if isinstance(value, dict):
            for key, item in value.items():
                value[key] = edit(item) or ""
        else:
            setattr(task, name, edit(value))
    return task


def _is_literal(text: str) -> bool:
    return text.startswith(_RAW_OPEN) and text.endswith(_RAW_CLOSE)
