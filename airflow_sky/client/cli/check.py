"""`airflow-sky check FILE.yaml [--env K=V]... [--env-file F]`: validate a task and print it normalized."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_sky.client.cli.common import add_env_arguments, load_task


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="validate a task YAML and print it normalized",
        description="Validate a SkyPilot-style task YAML; print the normalized task as YAML on stdout. "
        "An invalid task prints one error line on stderr and exits with status 2.",
    )
    parser.add_argument("file", metavar="FILE.yaml", help="the task YAML")
    add_env_arguments(parser)
    parser.add_argument(
        "--show-secrets", action="store_true", help="print secret values instead of <redacted>"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the task (SpecError propagates to the CLI's one-line error, exit 2) and print it."""
    task = load_task(args)
    sys.stdout.write(task.to_yaml(redact_secrets=not args.show_secrets))
    return 0
