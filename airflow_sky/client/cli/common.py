"""Arguments and task loading shared by the subcommands that take a task YAML."""

from __future__ import annotations

import argparse
import configparser
import os
import re
import sys
import warnings
from collections.abc import Mapping

from airflow_sky.errors import SpecError
from airflow_sky.task import GitWorkdir, SpecWarning, Task, parse_env_args
from airflow_sky.task.overrides import read_env_file
from airflow_sky.task.redaction import GIT_TOKEN

_BARE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def secret_values(args: argparse.Namespace) -> dict[str, str]:
    """--secret-file's values with --secret's over them (the command line wins, as for --env/--env-file)."""
    secret_file = getattr(args, "secret_file", None)
    values = read_env_file(secret_file) if secret_file is not None else {}
    return {**values, **env_values("--secret", getattr(args, "secret", []))}


def load_task(args: argparse.Namespace, *, allow_unset: bool = False) -> Task:
    """The task of `args.file` with --env/--env-file/--secret/--secret-file applied; SpecWarnings print as
    one line each. Without a file (`launch`/`exec` given a command, or nothing): the task of
    `args.run_command` (None: a task that runs nothing), built by the task layer as sky builds it."""
    overrides = env_values("--env", args.env)
    secrets = secret_values(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        # Secrets fill the YAML's `secrets: {KEY: null}` too; they are made secrets below whatever the YAML says.
        values = {**overrides, **secrets}
        if args.file is None:
            from airflow_sky.task.entrypoint import command_task

            task = command_task(
                getattr(args, "run_command", None),
                env_overrides=values,
                env_file=args.env_file,
                allow_unset=allow_unset,
            )
        else:
            task = Task.from_yaml(
                args.file, env_overrides=values, env_file=args.env_file, allow_unset=allow_unset
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


def git_credentials_from_environment(task: Task, environ: Mapping[str, str], *, key_path: bool) -> None:
    """As `sky launch` does for a git workdir: GIT_TOKEN (HTTPS URLs) becomes a secret, whether the task
    gives it as an env or this shell's environment has it; with `key_path`, GIT_SSH_KEY_PATH (SSH URLs)
    from this shell's environment is passed on. The task's own values win."""
    if not isinstance(task.workdir, GitWorkdir):
        return
    from airflow_sky.node.git_workdir import GIT_SSH_KEY_PATH, url_kind  # (the node layer loads SSH: lazily)

    kind = url_kind(task.workdir.url)
    if kind == "http":
        token = task.secrets.get(GIT_TOKEN) or task.envs.pop(GIT_TOKEN, None) or environ.get(GIT_TOKEN)
        if token:
            task.update_secrets({GIT_TOKEN: token})
    key = environ.get(GIT_SSH_KEY_PATH)
    if kind == "ssh" and key_path and key and GIT_SSH_KEY_PATH not in task.envs_and_secrets:
        task.update_envs({GIT_SSH_KEY_PATH: key})


def check_git_workdir(task: Task) -> None:
    """A git workdir whose repository or ref cannot be read fails here, before any node is provisioned
    (the job itself pins its commit when it registers)."""
    if isinstance(task.workdir, GitWorkdir):
        from airflow_sky.node.git_commit import resolve_commit

        resolve_commit(task.workdir, task.envs_and_secrets)


def check_buckets(task: Task, infra: str, *, fatal: bool = True) -> None:
    """The task's bucket mounts on `infra`, checked before anything starts; where airflow-sky's behaviour
    differs from SkyPilot's, one note each on stderr. With `fatal=False` (check), a mount that a launch on
    `infra` would refuse is a note too. `[sky] default_store` is read as the launch's tasks will read it
    (the environment, then the CLI's airflow.cfg: cli_sky_setting)."""
    from airflow_sky.infra.local.daemon import check_shared_mounts
    from airflow_sky.task.storage import bucket_mounts, default_store, mount_notes, shared_mount_paths

    try:
        configured = cli_sky_setting("default_store") if default_store(infra) is None else None
        mounts = bucket_mounts(task, default_store(infra, configured))
        if infra.split("/", 1)[0] == "local":
            check_shared_mounts(shared_mount_paths(mounts))
    except SpecError as e:
        if fatal:
            raise
        print(f"airflow-sky: note: launching on {infra} would fail: {e}", file=sys.stderr)
        return
    for note in mount_notes(mounts):
        print(f"airflow-sky: note: {note}", file=sys.stderr)


def cli_sky_setting(name: str) -> str | None:
    """`[sky] <name>` as the launch engine will read it (the environment, then the CLI's own airflow.cfg),
    without loading Airflow: the engine configures Airflow later, and a configuration loaded before that
    would keep this shell's AIRFLOW__* settings. Airflow's `_cmd`/`_secret` forms are not read here (the
    engine's tasks read them: node.settings)."""
    from airflow_sky.client.engine import private_airflow_home

    value = os.environ.get(f"AIRFLOW__SKY__{name.upper()}")
    if value is None:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(private_airflow_home() / "airflow.cfg")
        except configparser.Error:
            return None  # a broken file: the engine's Airflow says what is wrong with it
        value = parser.get("sky", name, fallback=None)
    return (value.strip() or None) if value else None
