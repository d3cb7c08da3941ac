"""`airflow-sky status --endpoints CLUSTER [PORT]`: misuse is one error line (exit 2) before any infra is
asked; the endpoints themselves are proven on real local nodes in tests/local/test_endpoints.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sky.client.cli import main


@pytest.fixture(autouse=True)
def _homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--endpoints"], "name exactly one cluster"),
        (["status", "--endpoints", "a", "b"], "name exactly one cluster"),
        (["status", "--endpoint", "80", "a", "b"], "name exactly one cluster"),
        (["status", "a", "8080"], "8080 is no cluster name (a port goes with --endpoints)"),
    ],
)
def test_endpoints_misuse_is_one_error_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("airflow-sky: error: ") and message in err and err.count("\n") == 1, err


def test_endpoints_and_endpoint_cannot_be_combined(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["status", "--endpoints", "a", "--endpoint", "80"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
