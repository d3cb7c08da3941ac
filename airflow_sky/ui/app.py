"""The progress view's FastAPI app, mounted by the plugin under URL_PREFIX in Airflow's API server.

    GET {URL_PREFIX}/api/v1/progress/{dag_id}/{run_id}[?history=0]   the run's jobs and their progress (JSON)
    GET {URL_PREFIX}/progress/{dag_id}/{run_id}[?rank=N]             the page that shows it, refreshed every 2 s
    GET {URL_PREFIX}/static/...                                      the page's script and style (no data)
    POST {URL_PREFIX}/api/v1/sweeps/{dag_id}/{run_id}/{sweep}/cancel  cancel a sweep (body {"confirm": true})

Both data routes go through Airflow's own auth dependency (`requires_access_dag`: read access to the
DAG's runs; the cancel: edit access to them, so a user who may only read the DAG gets 403), which takes a
bearer JWT or the UI's `_token` cookie, as the UI's own API calls do. The routes
are plain functions: FastAPI runs them in its threadpool, so reading a cluster never blocks the server's
event loop.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, status
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from airflow_sky.ui.cache import TtlCache
from airflow_sky.ui.run_jobs import RunNotFound, found_jobs, run_jobs
from airflow_sky.ui.sweeps import cancel_sweep


class CancelRequest(BaseModel):
    confirm: bool = False


URL_PREFIX = "/airflow-sky"
STATIC = resources.files("airflow_sky.ui") / "static"

_answers = TtlCache()
ReadRuns = Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN))
EditRuns = Depends(requires_access_dag(method="PUT", access_entity=DagAccessEntity.RUN))


def create_app() -> FastAPI:
    app = FastAPI(
        title="airflow-sky progress",
        description="A sky job's training progress (per-rank steps, metrics, recoveries) for the Airflow UI.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/api/v1/progress/{dag_id}/{run_id}", dependencies=[ReadRuns])
    def progress(
        dag_id: str, run_id: str, session: SessionDep, history: Annotated[bool, Query()] = True
    ) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = _answers.get(
                (dag_id, run_id, history), lambda: run_jobs(session, dag_id, run_id, with_history=history)
            )
        except RunNotFound as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
        return answer

    @app.post("/api/v1/sweeps/{dag_id}/{run_id}/{sweep}/cancel", dependencies=[EditRuns])
    def cancel(
        dag_id: str, run_id: str, sweep: str, body: CancelRequest, session: SessionDep, user: GetUserDep
    ) -> dict[str, Any]:
        # A JSON body: a plain cross-site form cannot send one without the browser asking first (CORS).
        if not body.confirm:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, 'send {"confirm": true} to cancel the sweep')
        try:
            jobs = found_jobs(session, dag_id, run_id)
            answer = cancel_sweep(session, dag_id, run_id, sweep, user.get_name(), jobs)
        except (RunNotFound, LookupError) as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
        _answers.clear()
        return answer

    @app.get("/progress/{dag_id}/{run_id}", dependencies=[ReadRuns], response_class=HTMLResponse)
    def page(dag_id: str, run_id: str) -> HTMLResponse:
        # The page is static: its script reads the DAG, run and rank from its own URL (never pasted into HTML).
        return HTMLResponse((STATIC / "progress.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app


app = create_app()
