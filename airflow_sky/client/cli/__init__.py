"""The `airflow-sky` command. Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from airflow_sky.errors import SkyError

# module name -> each module defines `register(subparsers)`; the handler it sets returns an exit code.
_SUBCOMMAND_MODULES = (
    "check",
    "launch",
    "clusters",
    "cost_report",
    "cluster_jobs",
    "progress_view",
    "managed_jobs",
    "local",
)

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a process killed by SIGPIPE: `airflow-sky logs C | head`
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


def _check_cluster_names(args: argparse.Namespace) -> None:
    """Every cluster name on the command line: one SkyPilot refuses is refused, before anything runs; one it
    accepts that is no host name label here (`Dev_Box`) is used as one (`dev-box`), and said so."""
    from airflow_sky.client.cluster_names import check_cluster_name, cluster_name_note

    if getattr(args, "command", None) == "ssh" and args.cluster in ("check", "unlock"):
        return  # `ssh check|unlock POOL` names a pool
    if isinstance(getattr(args, "cluster", None), str):
        note = cluster_name_note(args.cluster)
        if note is not None:
            print(f"airflow-sky: note: {note}", file=sys.stderr)
        args.cluster = check_cluster_name(args.cluster)
    if isinstance(getattr(args, "clusters", None), list):
        args.clusters = [check_cluster_name(name) for name in args.clusters]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from airflow_sky.client.engine import bind_private_home

    bind_private_home()  # the CLI never runs in a user's real Airflow, not even to import a hook
    try:
        _select_pool_file(args.pool_file)
        _check_cluster_names(args)
        return int(args.handler(args))
    except SkyError as e:
        print(f"airflow-sky: error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        print("airflow-sky: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return silence_stdout()


def silence_stdout() -> int:
    """The reader of stdout went away (`| head`): send what is still buffered nowhere, quietly.

    Python would otherwise report the failed flush at exit ("Exception ignored ... BrokenPipeError").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


class PipeSafeOutput:
    """stdout for output written from several threads (node logs), once its reader has gone (`| head`).

    `exit=True` (commands that only read, like logs): the command ends there, quietly, as a process killed
    by SIGPIPE does, instead of each thread printing a BrokenPipeError traceback. `exit=False` (launch,
    exec): the output is dropped and the command goes on, so the job still runs to its end and the exit
    status still says how it ended.
    """

    def __init__(self, stream: TextIO, exit: bool = True) -> None:
        self._stream = stream
        self._exit = exit
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding...: the stream's
        return getattr(self._stream, name)

    def _gone(self) -> None:
        self.closed_by_reader = True
        if self._exit:
            os._exit(silence_stdout())
        # From here on, nowhere; closed now, so the unwritten rest fails no flush at exit.
        broken, self._stream = self._stream, open(os.devnull, "w")  # noqa: SIM115 - lives as long as this
        with contextlib.suppress(OSError):
            broken.close()
