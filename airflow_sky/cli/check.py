"""`airflow-sky check FILE.yaml [--env K=V]... [--env-file F]`: validate a task and print it normalized."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from airflow_sky.spec import SpecWarning, Task, parse_env_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate a task YAML and print it normalized",
        description="Validate a SkyPilot-style task YAML; print the normalized task as YAML on stdout. "
        "An invalid task prints one error line on stderr and exits with status 2.",
    )
    parser.add_argument("file", metavar="FILE.yaml", help="the task YAML")
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
    parser.add_argument(
        "--show-secrets", action="store_true", help="print secret values instead of <redacted>"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the task (SpecError propagates to the CLI's one-line error, exit 2) and print it."""
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
    sys.stdout.write(task.to_yaml(redact_secrets=not args.show_secrets))
    return 0
