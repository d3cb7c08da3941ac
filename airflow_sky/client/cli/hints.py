"""Commands the CLI suggests, rebuilt from what the user typed: a hint that drops a flag leads astray."""

from __future__ import annotations

import argparse
import shlex

# The task override flags `exec` and `launch` share (launch.add_task_overrides): argparse dest -> flag.
_VALUE_FLAGS = (
    ("infra", "--infra"),
    ("num_nodes", "--num-nodes"),
    ("gpus", "--gpus"),
    ("cpus", "--cpus"),
    ("memory", "--memory"),
    ("instance_type", "--instance-type"),
    ("region", "--region"),
    ("zone", "--zone"),
    ("disk_size", "--disk-size"),
    ("image_id", "--image-id"),
    ("git_url", "--git-url"),
    ("git_ref", "--git-ref"),
    ("env_file", "--env-file"),
    ("secret_file", "--secret-file"),
    ("pool_file", "--pool-file"),
    ("name", "--name"),
    ("workdir", "--workdir"),
)


def launch_command(cluster: str, args: argparse.Namespace) -> str:
    """`airflow-sky launch -c CLUSTER ENTRYPOINT ...` with every task override of `args` (an `exec`'s) kept,
    each value shell-quoted. A secret given with its value is passed bare (`--secret KEY`: taken from the
    shell's environment), so that no secret value is ever printed."""
    # The task YAML, or the command (`exec C 'cmd'`) as one word; with neither, the launch only provisions.
    what = getattr(args, "file", None) or " ".join(getattr(args, "entrypoint", None) or ())
    argv = ["airflow-sky", "launch", "-c", cluster, *([what] if what else [])]
    for dest, flag in _VALUE_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            argv += [flag, str(value)]
    use_spot = getattr(args, "use_spot", None)
    if use_spot is not None:
        argv.append("--use-spot" if use_spot else "--no-use-spot")
    for port in getattr(args, "ports", None) or ():
        argv += ["--ports", port]
    for env in getattr(args, "env", None) or ():
        argv += ["--env", env]
    for secret in getattr(args, "secret", None) or ():
        argv += ["--secret", secret.partition("=")[0]]
    return shlex.join(argv)
