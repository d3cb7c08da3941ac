"""Every file in tests/task/invalid/ is rejected with one line naming the file and the field it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sky import SpecError, Task

INVALID_DIR = Path(__file__).parent / "invalid"
INVALID_FILES = sorted(INVALID_DIR.glob("*.yaml"))


def declared_field(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    prefix = "# field: "
    if not first.startswith(prefix):
        raise ValueError(f"{path.name}: the first line must be '# field: <dotted.path>'")
    return first[len(prefix) :].strip()


def test_there_are_at_least_30_invalid_examples() -> None:
    assert len(INVALID_FILES) >= 30


@pytest.mark.parametrize("path", INVALID_FILES, ids=[p.stem for p in INVALID_FILES])
def test_invalid_task_raises_one_line_error_naming_file_and_field(path: Path) -> None:
    field = declared_field(path)
    with pytest.raises(SpecError) as info:
        Task.from_yaml(path)
    message = str(info.value)
    assert "\n" not in message
    assert path.name in message
    assert f": {field}" in message, message
