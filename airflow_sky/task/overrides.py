"""Launch-time env values (`--env K=V`, `--env-file F`) and `$VAR` substitution from the task's final envs.

Precedence, as in SkyPilot: `--env` > env-file > the YAML's own `envs`/`secrets`. An override whose key is a
secret replaces the secret; any other key lands in `envs` (adding it when the YAML does not declare it).
"""

from __future__ import annotations

import io
import os
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.task.schema import ENV_KEY_PATTERN
from airflow_sky.task.text_files import read_text_file

_ENV_KEY = re.compile(ENV_KEY_PATTERN)


def parse_env_args(args: Iterable[str]) -> dict[str, str]:
    """`--env KEY=VALUE` arguments -> {KEY: VALUE}; the value may be empty and may contain '='."""
    result: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise SpecError(f"--env: must be KEY=VALUE with KEY matching {ENV_KEY_PATTERN}, got {arg!r}")
        result[key] = value
    return result


def read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """A dotenv file -> {KEY: VALUE}, read with python-dotenv's parser (quotes, `export`, comments).

    Values are taken literally: `${VAR}` inside them is not expanded from the launcher's environment.
    """
    label = f"--env-file {os.fspath(path)}"
    text = read_text_file(path, label)
    result: dict[str, str] = {}
    for line_no, key, value in _bindings(text):
        where = f"{label}: line {line_no}"
        if key is None or not _ENV_KEY.match(key):
            raise SpecError(f"{where}: expected KEY=VALUE with KEY matching {ENV_KEY_PATTERN}")
        if value is None:
            raise SpecError(f"{where}: {key} has no value; write {key}=VALUE")
        result[key] = value
    return result


def _bindings(text: str) -> list[tuple[int, str | None, str | None]]:
    """(line number, key, value) per assignment, parsed by python-dotenv; key None marks an unparsable line."""
    from dotenv.parser import parse_stream  # here: only the commands given an env file need it

    found: list[tuple[int, str | None, str | None]] = []
    for binding in parse_stream(io.StringIO(text)):
        if binding.error or binding.key is not None:
            found.append((binding.original.line, None if binding.error else binding.key, binding.value))
    return found


def merge_overrides(
    env_overrides: Mapping[str, str] | None, env_file_values: Mapping[str, str] | None
) -> dict[str, str]:
    """One mapping in precedence order: `--env` values beat env-file values (as `sky launch` merges them)."""
    return {**(env_file_values or {}), **(env_overrides or {})}


def apply_overrides(
    envs: Mapping[str, Any], secrets: Mapping[str, Any], overrides: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(envs, secrets) with launch-time values applied; a key already in `secrets` stays a secret."""
    new_envs, new_secrets = dict(envs), dict(secrets)
    for key, value in overrides.items():
        if not _ENV_KEY.match(key):
            raise SpecError(f"--env: invalid name {key!r}; names must match {ENV_KEY_PATTERN}")
        (new_secrets if key in new_secrets else new_envs)[key] = value
    return new_envs, new_secrets


def substitute(value: Any, mapping: Mapping[str, str]) -> Any:
    """Replace $VAR / ${VAR} in every string (mapping keys too) with string.Template; unknown names stay."""
    if isinstance(value, str):
        return string.Template(value).safe_substitute(mapping)
    if isinstance(value, dict):
        return {substitute(k, mapping): substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(item, mapping) for item in value]
    return value


def as_references(value: Any, secrets: Mapping[str, str], mapping: Mapping[str, str]) -> Any:
    """`protect`, and every secret's value written back as `${NAME}`: substituting the result with the same
    values gives `value` again, and the text itself holds no secret (a managed job's run conf)."""
    found = sorted(((v, k) for k, v in secrets.items() if v), key=lambda pair: -len(pair[0]))
    if not found:
        return protect(value, mapping)
    names = dict(found)  # value -> name; longest values first, so one inside another is not cut
    pattern = re.compile("|".join(re.escape(v) for v, _ in found))

    def refer(text: str) -> str:
        if not pattern.search(text):
            return protect(text, mapping)
        parts = pattern.split(text)  # the text around each secret; `$` there escaped
        hits = pattern.findall(text)
        out = [parts[0].replace("$", "$$")]
        for hit, part in zip(hits, parts[1:], strict=True):
            out += ["${", names[hit], "}", part.replace("$", "$$")]
        return "".join(out)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return refer(item)
        if isinstance(item, dict):
            return {walk(k): walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    return walk(value)


def protect(value: Any, mapping: Mapping[str, str]) -> Any:
    """Inverse for output: escape '$' as '$$' where substituting again would change a string, so a
    serialized task reads back to the same values."""
    if isinstance(value, str):
        return value.replace("$", "$$") if substitute(value, mapping) != value else value
    if isinstance(value, dict):
        return {protect(k, mapping): protect(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [protect(item, mapping) for item in value]
    return value
