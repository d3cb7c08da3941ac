"""Hostile task files and env files: each ends in one SpecError line naming the file and the field, within a
second of CPU and a bounded amount of memory; through the real CLI (`check`, `launch`), exit status 2 and
one line on stderr, never a traceback. Secrets substituted into paths and URLs are never printed."""

from __future__ import annotations

import re
import resource
import subprocess
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from airflow_sky.errors import SpecError
from airflow_sky.task import Task, read_env_file
from airflow_sky.task.pipeline import Pipeline, is_pipeline_file
from airflow_sky.task.yaml_io import MAX_YAML_DEPTH, MAX_YAML_DOCUMENTS, MAX_YAML_NODES

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# The 325-byte file: each level nine aliases of the one above, 9**7 = 4.8 million strings expanded
# (today's PyYAML builds them lazily; the schema check, the `$VAR` substitution and the YAML dump did not).
BILLION_LAUGHS = """\
run: echo hi
service:
  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""

# name -> (file content, what the one error line says after "<file>: ")
HOSTILE_FILES: dict[str, tuple[bytes, str]] = {
    "list_key": (b"run: x\nconfig:\n  ? [a, b]\n  : 1\n", "line 3, column 5: config: a mapping key must be"),
    "flow_list_key": (b"run: x\nconfig: {[a]: 1}\n", "line 2, column 10: config: a mapping key must be"),
    "mapping_key": (b"run: x\nservice:\n  x:\n    ? {a: 1}\n    : 2\n", "service.x: a mapping key must be"),
    "alias_of_list_as_key": (b"run: x\nconfig:\n  a: &l [1]\n  ? *l\n  : 2\n", "config: a mapping key must"),
    "not_utf8": (b"name: x\nrun: echo \xff\xfe\n", "line 2, column 11: not UTF-8 text (byte 0xff)"),
    "latin1_name": ("name: caf\u00e9\nrun: x\n".encode("latin-1"), "line 1, column 10: not UTF-8 text"),
    "deep_lists": (
        b"run: x\nservice: " + b"[" * 3000 + b"]" * 3000 + b"\n",
        f"line 2, column 74: service: nested more than {MAX_YAML_DEPTH} lists/mappings deep",
    ),
    "deep_mappings": (
        b"run: x\nconfig: " + b"{a: " * 3000 + b"1" + b"}" * 3000 + b"\n",
        f"nested more than {MAX_YAML_DEPTH} lists/mappings deep",
    ),
    "billion_laughs": (
        BILLION_LAUGHS.encode(),
        f"service.e: the file holds more than {MAX_YAML_NODES} values (lists, mappings and scalars, "
        "with aliases (*name) expanded)",
    ),
    "deep_by_aliases": (
        b"run: x\nconfig:\n  a: &a "
        + b"[" * 40
        + b"]" * 40
        + b"\n  b: "
        + b"[" * 40
        + b"*a"
        + b"]" * 40
        + b"\n",
        "once its aliases (*name) are expanded",
    ),
    "recursive_alias": (
        b"run: x\nservice: &a [1, *a]\n",
        "an alias (*name) names a list or mapping that contains",
    ),
    "impossible_date": (
        b"run: x\nservice: {when: 2024-13-45}\n",
        "cannot read '2024-13-45' as !!timestamp: month must be",
    ),
    "huge_integer": (b"run: x\nservice: {n: " + b"9" * 5000 + b"}\n", "line 2, column 14: cannot read '9999"),
    "too_many_documents": (
        b"name: p\n" + b"---\nrun: x\n" * (MAX_YAML_DOCUMENTS + 5),
        f"more than {MAX_YAML_DOCUMENTS} YAML documents",
    ),
    "mount_escapes_home": (
        b"run: x\nfile_mounts:\n  ../../.ssh/authorized_keys: ./key.pub\n",
        "file_mounts.../../.ssh/authorized_keys: remote path must not contain '..'",
    ),
    "mount_escapes_by_tilde": (
        b"run: x\nfile_mounts:\n  ~/../../etc/cron.d/x: ./x\n",
        "file_mounts.~/../../etc/cron.d/x: remote path must not contain '..'",
    ),
    "mount_escapes_by_env": (
        b"envs: {UP: ..}\nrun: x\nfile_mounts:\n  $UP/.bashrc: ./x\n",
        "file_mounts.../.bashrc: remote path must not contain '..'",
    ),
    "too_large": (
        b"run: |\n" + b"  echo padding padding padding padding padding\n" * 6000,
        "larger than 256 KiB",
    ),
}


def _write(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    return path


def _load(path: Path) -> object:
    """What `check` loads: a pipeline file as a pipeline, any other file as one task (a template allowed)."""
    if is_pipeline_file(path):
        return Pipeline.from_yaml(path, allow_unset=True)
    return Task.from_yaml(path, allow_unset=True)


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_a_hostile_file_is_one_line_naming_file_and_field_within_a_second_and_bounded_memory(
    name: str, tmp_path: Path
) -> None:
    content, expected = HOSTILE_FILES[name]
    path = _write(tmp_path, name, content)
    tracemalloc.start()
    started = time.process_time()
    try:
        with warnings.catch_warnings(), pytest.raises(SpecError) as raised:
            warnings.simplefilter("ignore")
            _load(path)
    finally:
        cpu = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    message = str(raised.value)
    assert message.startswith(f"{path}: "), message
    assert expected in message, message
    assert "\n" not in message
    assert cpu < 1.0, f"{name}: {cpu:.2f} s of CPU"
    assert peak < 64 * 2**20, f"{name}: {peak / 2**20:.0f} MiB at the peak"


@pytest.mark.parametrize(
    "name",
    ["list_key", "not_utf8", "deep_lists", "billion_laughs", "mount_escapes_home", "recursive_alias"],
)
@pytest.mark.parametrize("command", [["check"], ["launch", "-y", "--dryrun"]])
def test_the_cli_exits_2_with_one_line_for_a_hostile_file(
    name: str, command: list[str], run_cli: RunCli, tmp_path: Path
) -> None:
    content, expected = HOSTILE_FILES[name]
    path = _write(tmp_path, name, content)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_cli(*command, str(path))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"airflow-sky: error: {path}: "), result.stderr
    assert expected in lines[0]
    # The child's whole life, interpreter start and imports included (the parse itself is bounded above).
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu < 10, f"{cpu:.1f} s of CPU"


def test_an_env_file_that_is_not_utf8_is_one_line_naming_it(run_cli: RunCli, tmp_path: Path) -> None:
    env_file = tmp_path / "launch.env"
    env_file.write_bytes(b"A=1\nB=caf\xe9\n")
    with pytest.raises(
        SpecError, match=r"^--env-file .*launch\.env: line 2, column 6: not UTF-8 text \(byte 0xe9\)"
    ):
        read_env_file(env_file)
    task = _write(tmp_path, "task", b"run: echo $B\nenvs: {B: null}\n")
    result = run_cli("check", str(task), "--env-file", str(env_file))
    assert result.returncode == 2
    assert result.stderr == (
        f"airflow-sky: error: --env-file {env_file}: line 2, column 6: not UTF-8 text (byte 0xe9); "
        "save the file as UTF-8\n"
    )


def test_a_device_or_folder_given_as_a_task_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    for path in ("/dev/zero", str(tmp_path)):
        with pytest.raises(SpecError, match=rf"^{re.escape(path)}: not a regular file"):
            Task.from_yaml(path)


def test_well_formed_files_within_the_limits_still_load(tmp_path: Path) -> None:
    # Anchors and aliases as people use them (shared envs), a key given as an explicit `? name`, nesting and
    # a size near (not over) the limits: all read as before.
    shared = "x" * 100
    path = _write(
        tmp_path,
        "ok",
        (
            "run: echo hi\n"
            "envs: &shared {A: '1', B: '2'}\n"
            f"service: {{readiness_probe: /health, copies: [*shared, *shared], deep: {'[' * 60}{']' * 60}}}\n"
            f"config:\n  ? plain_key\n  : {shared}\n"
            f"  many: [{', '.join(['1'] * (MAX_YAML_NODES - 100))}]\n"
            "file_mounts:\n  ~/data/..hidden/x: ./x\n  ./a..b: ./y\n"
        ).encode(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        task = Task.from_yaml(path)
    assert task.envs == {"A": "1", "B": "2"}
    assert task.extra_fields["service"]["copies"] == [{"A": "1", "B": "2"}] * 2
    assert set(task.file_mounts) == {"~/data/..hidden/x", "~/sky_workdir/a..b"}


def test_secrets_substituted_into_workdir_and_file_mounts_are_never_printed(
    run_cli: RunCli, tmp_path: Path
) -> None:
    token = "ghp_s3cr3tT0ken"
    path = _write(
        tmp_path,
        "git",
        (
            "run: echo hi\n"
            f"secrets:\n  GH_TOKEN: {token}\n"
            "workdir:\n  url: https://x:$GH_TOKEN@git.example.com/r.git\n"
            "file_mounts:\n  /data/${GH_TOKEN}/in: s3://bucket-$GH_TOKEN/in\n"
            "service:\n  readiness_probe: /health?token=$GH_TOKEN\n"
        ).encode(),
    )
    result = run_cli("check", str(path))
    assert result.returncode == 0, result.stderr
    assert token not in result.stdout + result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["workdir"] == {"url": "https://x:<redacted>@git.example.com/r.git"}
    assert shown["file_mounts"] == {"/data/<redacted>/in": "s3://bucket-<redacted>/in"}
    assert shown["service"] == {"readiness_probe": "/health?token=<redacted>"}
    assert shown["secrets"] == {"GH_TOKEN": "<redacted>"}
    revealed = run_cli("check", "--show-secrets", str(path))
    assert token in yaml.safe_load(revealed.stdout)["workdir"]["url"]


@pytest.mark.parametrize("command", [["check"], ["launch", "-y", "--dryrun"]])
def test_an_error_about_a_field_a_secret_was_substituted_into_shows_it_redacted(
    command: list[str], run_cli: RunCli, tmp_path: Path
) -> None:
    token = "ghp_s3cr3tT0ken"
    path = _write(
        tmp_path,
        "bad",
        f"run: x\nsecrets: {{TOKEN: {token}}}\nfile_mounts:\n  /d/$TOKEN: ftp://h/x\n".encode(),
    )
    result = run_cli(*command, str(path))
    assert result.returncode == 2
    assert result.stderr == (
        f"airflow-sky: error: {path}: file_mounts./d/<redacted>: unsupported URI scheme 'ftp'; supported: "
        "s3://, gs://, r2://, https://, cos://, oci://, nebius://, cw://\n"
    )


def test_a_task_travels_with_secret_references_instead_of_substituted_values() -> None:
    # A managed job's run conf: the token of a git URL goes as ${GH_TOKEN}, its value in a Variable; the task
    # loads back equal once the secrets are given. Literal `$`s stay escaped.
    token = "ghp_s3cr3t$T0ken"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        task = Task.from_dict(
            {
                "run": "x",
                "secrets": {"GH_TOKEN": token, "SHORT": "ghp"},
                "envs": {"PRICE": "5$"},
                "workdir": {"url": "https://x:$GH_TOKEN@git.example.com/r.git?p=$$1"},
                "file_mounts": {"/d/${GH_TOKEN}/$PRICE": "s3://bucket/${SHORT}x"},
                "service": {"probe": "/health?t=$GH_TOKEN"},
            }
        )
        sent = task.to_dict(secret_references=True)
        sent.pop("secrets")
        assert "s3cr3t" not in str(sent)
        assert sent["workdir"] == {"url": "https://x:${GH_TOKEN}@git.example.com/r.git?p=$$1"}
        assert sent["file_mounts"] == {"/d/${GH_TOKEN}/5$$": "s3://bucket/${SHORT}x"}
        assert sent["service"] == {"probe": "/health?t=${GH_TOKEN}"}
        received = Task.from_dict({**sent, "secrets": {"GH_TOKEN": token, "SHORT": "ghp"}})
    assert received == task
    assert received.workdir is not None and token in str(received.workdir)
