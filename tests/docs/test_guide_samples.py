"""The terminal samples the docs show are what the current CLI prints: each console block marked
`<!-- sample: checked -->` is run for real (the commands after `$`, from the repository root, with a fresh
airflow-sky home) and every line it shows must come out of that run, in order. `...` in a sample stands for
any lines. What changes from run to run is compared by shape: numbers (times, pids, steps, addresses), paths,
runs of spaces and table rules. A quick run may add `--env` values (QUICK_ENVS: a smaller model, fewer steps)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_sky.infra.local import daemon

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- sample: checked -->"
# Per task file: envs that keep the run short (minGPT: tests/examples/test_mingpt_local.py's tiny model).
QUICK_ENVS = {
    "examples/mingpt/train.yaml": {
        "MAX_STEPS": "20",
        "LOG_EVERY": "10",
        "N_LAYER": "1",
        "N_HEAD": "2",
        "N_EMBD": "32",
        "BLOCK_SIZE": "32",
        "BATCH_SIZE": "16",
    }
}
_NUMBER = re.compile(r"\d+(\.\d+)?")
_PATH = re.compile(r"\S*/\S*")
_RULE = re.compile(r"([━─═│┃╇┿]+)")
_NODE = re.compile(r"\((setup )?[\w-]+, rank=\d+")  # a node line's prefix, without its pid


@dataclass
class Sample:
    doc: str
    line: int
    commands: list[list[str]]
    shown: list[str]  # the lines the sample shows after its commands


def samples() -> list[Sample]:
    found = []
    for doc in [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARKER:
                continue
            assert lines[i + 1].strip() == "```console", (
                f"{doc.name}:{i + 1}: the marker must precede a console block"
            )
            end = lines.index("```", i + 2)
            block = lines[i + 2 : end]
            commands = [shlex.split(b[2:]) for b in block if b.startswith("$ ")]
            shown = [b for b in block if not b.startswith("$ ")]
            found.append(Sample(doc.name, i + 1, commands, shown))
    return found


def shape(line: str) -> str:
    line = _PATH.sub("<path>", line)
    line = _NUMBER.sub("#", line)
    line = _RULE.sub(lambda m: m.group(1)[0], line)
    return " ".join(line.split())


def _stream(line: str) -> str:
    """Which output a line belongs to: a node's (its `(head, rank=0, ...)` prefix) or the CLI's own."""
    node = _NODE.match(line)
    return node.group(0) if node else "cli"


def missing_lines(shown: list[str], output: str) -> list[str]:
    """The sample's lines (by shape) that the output does not have in the same order within their stream
    (each node's lines, the CLI's lines: ranks interleave as they run); `...` matches any lines."""
    produced: dict[str, list[str]] = {}
    for line in output.splitlines():
        produced.setdefault(_stream(line), []).append(shape(line))
    positions: dict[str, int] = {}
    missing = []
    for line in shown:
        if line.strip() == "...":
            continue
        stream = _stream(line)
        try:
            positions[stream] = produced.get(stream, []).index(shape(line), positions.get(stream, 0)) + 1
        except ValueError:
            missing.append(line)
    return missing


def _quick(command: list[str]) -> list[str]:
    for task_file, envs in QUICK_ENVS.items():
        if task_file in command:
            return command + [f"--env={key}={value}" for key, value in envs.items()]
    return command


def _run(command: list[str], env: dict[str, str]) -> str:
    assert command[0] == "airflow-sky", command
    args = [sys.executable, "-m", "airflow_sky.client.cli", *_quick(command[1:])]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


def test_the_shape_rules_match_a_run_and_catch_a_changed_line() -> None:
    shown = ["Job 1 on cluster c (local): 2 nodes (127.0.0.2, 127.0.0.3)", "...", " total        │   146.9s"]
    output = "noise\nJob 3 on cluster c (local): 2 nodes (127.0.0.5, 127.0.0.6)\nmore\n total │ 9.0s\n"
    assert missing_lines(shown, output) == []
    assert missing_lines(["Job 1 on cluster c (aws): 2 nodes"], output) == [
        "Job 1 on cluster c (aws): 2 nodes"
    ]
    assert missing_lines([shown[2], shown[0]], output) == [shown[0]]  # order counts
    ranks = "(head, rank=0) a\n(worker1, rank=1) b\n(head, rank=0) c\n"
    assert missing_lines(["(head, rank=0) a", "(worker1, rank=1) b", "(head, rank=0) c"], ranks) == []
    assert missing_lines(["(head, rank=0) c", "(worker1, rank=1) b", "(head, rank=0) a"], ranks) == [
        "(head, rank=0) a"
    ]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sample", samples(), ids=lambda s: f"{s.doc}:{s.line}")
def test_a_docs_sample_is_what_the_cli_prints(sample: Sample, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_SKY_HOME=str(tmp_path / "sky"), AIRFLOW_SKY_SSH_CONFIG=str(tmp_path / "ssh_config"))
    env["OMP_NUM_THREADS"] = "1"
    output = "\n".join(_run(command, env) for command in sample.commands)
    missing = missing_lines(sample.shown, output)
    assert missing == [], (
        f"{sample.doc}:{sample.line}: lines the CLI no longer prints:\n"
        + "\n".join(missing)
        + "\n--- the run printed:\n"
        + output[-6000:]
    )
    for command in sample.commands:
        if "-c" in command:
            assert daemon.processes_with_marker(command[command.index("-c") + 1]) == []


def test_the_user_guide_has_checked_samples() -> None:
    assert any(s.doc == "user-guide.md" for s in samples())
