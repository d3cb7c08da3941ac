"""The Python the README and docs/ show runs as written: every block parses, and the DAG snippets a user copies
into a DAG folder (README, user guide) import cleanly in a real DagBag, with the shape they describe."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def dag_snippet(path: Path) -> str:
    """The one block of `path` that builds a DAG of a sky_job."""
    (block,) = [b for b in python_blocks(path) if "with DAG(" in b and "sky_job(" in b]
    return block


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_python_block_of_the_docs_parses(path: Path) -> None:
    for block in python_blocks(path):
        try:
            ast.parse(block)
        except SyntaxError as e:
            pytest.fail(f"{path.name}: a python block does not parse ({e}):\n{block}")


@pytest.mark.parametrize("doc", ["README.md", "docs/user-guide.md"])
def test_the_dag_snippet_imports_in_a_dag_folder_and_hands_the_result_to_evaluate(
    doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "train.py").write_text(dag_snippet(REPO / doc))
    # The snippet's relative YAML path: not next to this DAG file, so read from the working directory.
    monkeypatch.chdir(REPO)
    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}, bag.import_errors
    dag = bag.dags["train"]
    assert dag.get_task("minGPT-ddp.collect").downstream_task_ids >= {"evaluate"}
    assert dag.get_task("minGPT-ddp.collect").artifacts_to.endswith("/runs/{{ ds }}/")
