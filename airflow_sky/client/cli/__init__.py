"""The `airflow-sky` command. Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from airflow_sky.errors import SkyError

# module name -> each module defines `register(subparsers)`; the handler it sets returns an exit code.
_SUBCOMMAND_MODULES = ("check", "launch", "jobs", "local")

EXIT_USAGE = 2
POOL_FILE_HELP = "ssh node pools file (SkyPilot's ssh_node_pools.yaml format) for infra ssh/<pool>"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-sky", description="Run SkyPilot-style multi-node jobs as Apache Airflow DAGs."
    )
    parser.add_argument("--pool-file", help=POOL_FILE_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(f"airflow_sky.client.cli.{name}").register(subparsers)
    for sub in subparsers.choices.values():  # also after the subcommand, where users type it
        if sub.prog.split()[-1] != "local":
            sub.add_argument("--pool-file", default=argparse.SUPPRESS, help=POOL_FILE_HELP)
    return parser


def _select_pool_file(path: str | None) -> None:
    """--pool-file: the ssh node pools file for this command and every Airflow task it runs."""
    if path is None:
        return
    from airflow_sky.errors import SpecError
    from airflow_sky.infra.ssh.pools import POOL_FILE_ENV

    resolved = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(resolved):
        raise SpecError(f"--pool-file: {path} does not exist")
    os.environ[POOL_FILE_ENV] = resolved


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from airflow_sky.client.engine import bind_private_home

    bind_private_home()  # the CLI never runs in a user's real Airflow, not even to import a hook
    try:
        _select_pool_file(args.pool_file)
        return int(args.handler(args))
    except SkyError as e:
        print(f"airflow-sky: error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        print("airflow-sky: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
