"""Launch-time env values: `--env` arguments and `--env-file` files."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sky import SpecError
from airflow_sky.task import parse_env_args, read_env_file


def test_env_args_split_at_the_first_equals_sign() -> None:
    assert parse_env_args(["A=1", "B=x=y", "EMPTY=", "A=2"]) == {"A": "2", "B": "x=y", "EMPTY": ""}


@pytest.mark.parametrize("arg", ["NOEQUALS", "=value", "1A=x", "BAD-NAME=x"])
def test_bad_env_arg_is_a_one_line_spec_error_naming_env(arg: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_env_args([arg])
    assert str(info.value).startswith("--env: must be KEY=VALUE")
    assert repr(arg) in str(info.value)


def test_env_file_reads_dotenv_syntax(tmp_path: Path) -> None:
    path = tmp_path / "launch.env"
    path.write_text(
        "# comment\n"
        "\n"
        "PLAIN=value\n"
        "export EXPORTED=yes\n"
        "SINGLE='a $HOME b'\n"
        'DOUBLE="two words"\n'
        "EMPTY=\n"
        "LITERAL=${NOT_EXPANDED}\n"
    )
    assert read_env_file(path) == {
        "PLAIN": "value",
        "EXPORTED": "yes",
        "SINGLE": "a $HOME b",
        "DOUBLE": "two words",
        "EMPTY": "",
        "LITERAL": "${NOT_EXPANDED}",
    }


def test_env_file_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.env"
    path.write_text("A=1\nthis is not an assignment\n")
    with pytest.raises(SpecError, match=r"^--env-file .*bad\.env: line 2: expected KEY=VALUE"):
        read_env_file(path)


def test_env_file_key_without_value_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.env"
    path.write_text("A=1\nLONELY\n")
    with pytest.raises(SpecError, match=r"line 2: LONELY has no value"):
        read_env_file(path)


def test_missing_env_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^--env-file .*missing\.env: cannot read"):
        read_env_file(tmp_path / "missing.env")
