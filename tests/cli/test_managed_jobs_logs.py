"""How `jobs logs` reads a follow task's log through the REST API: Airflow leaves the continuation token out
whenever the task instance is not running (also between a deferral and its resumption), which ends a log
only when the task instance has ended."""

from __future__ import annotations

from typing import Any

from airflow_sky.client.managed_runs import _LogReader


class Pages:
    """The API's answers to one log's reads, in order; records the tokens it was asked with."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.tokens: list[str | None] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.tokens.append(kwargs["params"].get("token"))
        page = self.pages.pop(0)

        class Response:
            def json(self) -> dict[str, Any]:
                return page

        return Response()


def _event(text: str) -> dict[str, str]:
    return {"event": text, "logger": "airflow.task.operators.airflow_sky.operators.follow"}


def test_a_log_without_a_token_is_read_again_from_the_start_until_its_task_has_ended():
    a, b, c, d = (_event(x) for x in "abcd")
    noise = {"event": "Task instance is in running state", "logger": "airflow.task"}
    api = Pages(
        [
            {"content": [noise, a, b], "continuation_token": "t1"},
            {"content": [], "continuation_token": None},  # deferred -> queued: no token, not the end
            {"content": [noise, a, b, c], "continuation_token": "t2"},  # from the start again
            {"content": [d], "continuation_token": None},  # ended before this read: the end
        ]
    )
    reader = _LogReader(api, "dag", "run", "job.run_follow", 0, 1)  # type: ignore[arg-type]
    assert list(reader.read(final=False)) == ["a", "b"]
    assert list(reader.read(final=False)) == [] and not reader.done
    assert list(reader.read(final=False)) == ["c"]  # a and b are not printed twice
    assert list(reader.read(final=True)) == ["d"] and reader.done
    assert list(reader.read(final=True)) == []  # nothing asked once done
    assert api.tokens == [None, "t1", None, "t2"]
