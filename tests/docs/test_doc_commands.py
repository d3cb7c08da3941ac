"""Every `airflow-sky` command the README and docs/ show in a code block is one the current CLI takes: its
words parse with the real argument parser (a renamed or dropped flag in the docs fails here), and a task file
of this repository it names exists. The checked console samples are run for real (test_guide_samples.py);
these are parsed only, since many need a cloud or a pool."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from airflow_sky.client.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCED = re.compile(r"```[\w-]*\n(.*?)```", re.S)
_PROGRAM = re.compile(r"^(?:\$ )?(?:\S*/)?airflow-sky$")


def doc_commands(text: str) -> list[list[str]]:
    """The argument lists of the `airflow-sky ...` commands in `text`'s fenced blocks (continued lines
    joined, comments dropped, each command of an `&&` chain on its own)."""
    found = []
    for block in _FENCED.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # not shell (a YAML or Python line with a quote in it)
            command: list[str] = []
            for word in [*words, "&&"]:
                if word not in ("&&", "||", ";"):
                    command.append(word)
                    continue
                if command and _PROGRAM.match(command[0]):
                    found.append(command[1:])
                command = []
    return found


CASES = [
    pytest.param(path, argv, id=f"{path.name}: {' '.join(argv)[:60]}")
    for path in DOCS
    for argv in doc_commands(path.read_text())
]


def test_the_docs_show_commands_to_check() -> None:
    assert len(CASES) >= 20  # the README's quick start, each infra's page, the guide


@pytest.mark.parametrize(("path", "argv"), CASES)
def test_a_documented_command_parses_with_the_current_cli(path: Path, argv: list[str]) -> None:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: `airflow-sky {shlex.join(argv)}` is refused: {stderr.getvalue()}")
    for value in vars(args).values():
        for word in value if isinstance(value, list) else [value]:
            if isinstance(word, str) and word.startswith("examples/"):
                assert (REPO / word).exists(), f"{path.name}: `{shlex.join(argv)}` names a missing {word}"


def test_doc_commands_finds_commands_in_chains_and_continued_lines() -> None:
    text = (
        "```bash\n$ airflow-sky queue dev && .venv/bin/airflow-sky logs dev 1 --tail 20  # a comment\n"
        "airflow-sky launch -c x \\\n  t.yaml -y\npython -c 'print(1)'\n```\n"
    )
    assert doc_commands(text) == [
        ["queue", "dev"],
        ["logs", "dev", "1", "--tail", "20"],
        ["launch", "-c", "x", "t.yaml", "-y"],
    ]
