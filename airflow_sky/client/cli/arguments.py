"""The arguments the task-running subcommands share (launch, exec, check, jobs launch).

Light on purpose: every subcommand registers its arguments on each call of the CLI, so this imports
nothing but argparse (the task layer, Airflow and the rest load in the handler that needs them).
"""

from __future__ import annotations

import argparse


def add_task_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--infra", help="local (default), ssh/<pool>, aws[/region], gcp[/region]")
    parser.add_argument("--num-nodes", type=int, help="override num_nodes")
    parser.add_argument("--gpus", help="override resources.accelerators, e.g. L4:4")
    parser.add_argument("--cpus", help="override resources.cpus, e.g. 8 or 4+")
    parser.add_argument("--memory", help="override resources.memory in GiB, e.g. 32 or 32+")
    parser.add_argument("--instance-type", help="override resources.instance_type, e.g. g6.12xlarge")
    spot = parser.add_mutually_exclusive_group()
    spot.add_argument("--use-spot", dest="use_spot", action="store_true", default=None, help="spot instances")
    spot.add_argument("--no-use-spot", dest="use_spot", action="store_false", help="on-demand instances")
    parser.add_argument("--region", help="override the region (with the task's or --infra's cloud)")
    parser.add_argument("--zone", help="override the zone")
    parser.add_argument("--disk-size", type=int, help="override resources.disk_size (GiB)")
    parser.add_argument("--image-id", help="override resources.image_id")
    parser.add_argument(
        "--git-url",
        metavar="URL",
        help="git repository cloned into ~/sky_workdir on every node (sets the workdir to {url: URL}); "
        "a private HTTPS repository takes its token from GIT_TOKEN (this shell's environment or --secret)",
    )
    parser.add_argument(
        "--git-ref",
        metavar="REF",
        help="branch, tag or commit of the git workdir to check out (default: the remote's HEAD)",
    )
    add_env_arguments(parser)


def add_entrypoint(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """`ENTRYPOINT...` and the flags that only `launch`/`exec` take over it, with sky's meaning
    (airflow_sky.task.entrypoint reads them)."""
    parser.add_argument(
        "entrypoint",
        nargs="+" if required else "*",
        metavar="ENTRYPOINT",
        help="a task YAML, or a shell command run as the task (`'python train.py'`: quote it, or put it "
        "last)" + ("" if required else "; none: provision (or reuse) the cluster only, run nothing"),
    )
    parser.add_argument("-n", "--name", help="the task's name (the job's in `queue`); overrides the YAML")
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="a local directory synced to ~/sky_workdir on every node, where the task runs; overrides "
        "the YAML",
    )
    parser.add_argument(
        "--ports",
        action="append",
        default=[],
        metavar="PORT",
        help="a port (8080) or range (10000-10010) to open on the cluster, repeatable (`none`: no "
        "ports); replaces the YAML's resources.ports",
    )


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
        "--env-file",
        metavar="FILE",
        help="dotenv file of KEY=VALUE lines; overrides the YAML (--env overrides it)",
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
        help="dotenv file of KEY=VALUE secrets; overrides the YAML (--secret overrides it)",
    )
