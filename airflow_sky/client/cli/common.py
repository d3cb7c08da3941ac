"""Arguments and task loading shared by the subcommands that take a task YAML."""

from __future__ import annotations

import argparse
import sys
import warnings

from airflow_sky.task import SpecWarning, Task, parse_env_args


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an env (or secret) value at launch; repeatable; overrides the YAML",
    )
    parser.add_argument(
        "--env-file", metavar="FILE", help="dotenv file of KEY=VALUE lines; overrides --env and the YAML"
    )


def load_task(args: argparse.Namespace) -> Task:
    """The task of `args.file` with --env/--env-file applied; SpecWarnings print as one line each."""
    overrides = parse_env_args(args.env)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        task = Task.from_yaml(args.file, env_overrides=overrides, env_file=args.env_file)
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
