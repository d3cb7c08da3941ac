"""The `airflow-sky` command. Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from airflow_sky.errors import SkyError

# module name -> each module defines `register(subparsers)`; the handler it sets returns an exit code.
_SUBCOMMAND_MODULES = ("check", "launch", "jobs", "local")

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-sky", description="Run SkyPilot-style multi-node jobs as Apache Airflow DAGs."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(f"airflow_sky.client.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from airflow_sky.client.engine import bind_private_home

    bind_private_home()  # the CLI never runs in a user's real Airflow, not even to import a hook
    try:
        return int(args.handler(args))
    except SkyError as e:
        print(f"airflow-sky: error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        print("airflow-sky: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
