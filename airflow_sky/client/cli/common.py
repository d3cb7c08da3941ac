"""Arguments and task loading shared by the subcommands that take a task YAML."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings

from airflow_sky.errors import SpecError
from airflow_sky.task import SpecWarning, Task, parse_env_args
from airflow_sky.task.overrides import read_env_file

_BARE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="set an env value at launch (a bare KEY takes its value from this shell's environment); "
        "repeatable; overrides the YAML",
    )
    parser.add_argument(
        "--env-file", metavar="FILE", help="dotenv file of KEY=VALUE lines; overrides --env and the YAML"
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="set a secret at launch (a bare KEY takes its value from this shell's environment, so the "
        "value never lands on a command line); masked in every log; repeatable; overrides the YAML",
    )
    parser.add_argument(
        "--secret-file",
        metavar="FILE",
        help="dotenv file of KEY=VALUE secrets; overrides --secret and the YAML",
    )


def env_values(flag: str, args: list[str]) -> dict[str, str]:
    """`--env`/`--secret` arguments -> {KEY: VALUE}; a bare `KEY` is read from this process's environment,
    as `sky launch --env KEY` does. Error messages name the key, never a value."""
    bare = {arg for arg in args if _BARE_KEY.match(arg)}
    values = parse_env_args(arg for arg in args if arg not in bare) if flag == "--env" else {}
    if flag != "--env":
        for arg in args:
            if arg in bare:
                continue
            key, sep, value = arg.partition("=")
            if not sep or not _BARE_KEY.match(key):
                raise SpecError(f"{flag}: must be KEY or KEY=VALUE with KEY a valid env name, got {key!r}")
            values[key] = value
    for key in sorted(bare):
        if key not in os.environ:
            raise SpecError(f"{flag} {key}: {key} is not set in the local environment (or give {key}=VALUE)")
        values[key] = os.environ[key]
    return values


def load_task(args: argparse.Namespace, *, allow_unset: bool = False) -> Task:
    """The task of `args.file` with --env/--env-file/--secret/--secret-file applied; SpecWarnings print as
    one line each."""
    overrides = env_values("--env", args.env)
    secrets = env_values("--secret", getattr(args, "secret", []))
    secret_file = getattr(args, "secret_file", None)
    if secret_file is not None:
        secrets.update(read_env_file(secret_file))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        # Secrets fill the YAML's `secrets: {KEY: null}` too; they are made secrets below whatever the YAML says.
        task = Task.from_yaml(
            args.file, env_overrides={**overrides, **secrets}, env_file=args.env_file, allow_unset=allow_unset
        )
    if secrets:
        for key in secrets:
            task.envs.pop(key, None)
        task.update_secrets(secrets)
    for warning in caught:
        if issubclass(warning.category, SpecWarning):
            print(f"airflow-sky: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
                warning.file,
                warning.line,
            )
    return task
