"""The progress view's FastAPI app, mounted by the plugin under URL_PREFIX in Airflow's API server.

    GET {URL_PREFIX}/api/v1/progress/{dag_id}/{run_id}[?history=0]   the run's jobs and their progress (JSON)
    GET {URL_PREFIX}/progress/{dag_id}/{run_id}[?rank=N]             the page that shows it, refreshed every 2 s
    GET {URL_PREFIX}/static/...                                      the page's script and style (no data)
    POST {URL_PREFIX}/api/v1/sweeps/{dag_id}/{run_id}/{sweep}/cancel  cancel a sweep (body {"confirm": true})
    GET {URL_PREFIX}/fleet                                           the Sky page: every cluster, job, cost
    GET {URL_PREFIX}/api/v1/fleet[?ended_hours=24]                   its JSON (ui/fleet.py)
    POST {URL_PREFIX}/api/v1/fleet/clusters/{cluster}/{down|stop}?infra=I   (body {"confirm": true})
    POST {URL_PREFIX}/api/v1/fleet/jobs/{cluster}/{job_id}/cancel?infra=I    (body {"confirm": true})

Both data routes go through Airflow's own auth dependency (`requires_access_dag`: read access to the
DAG's runs; the cancel: edit access to them, so a user who may only read the DAG gets 403), which takes a
bearer JWT or the UI's `_token` cookie, as the UI's own API calls do. The routes
are plain functions: FastAPI runs them in its threadpool, so reading a cluster never blocks the server's
event loop. The Sky page needs read access to DAG runs; its actions need edit access to the runs of the
DAG that owns the cluster or submitted the job, checked here against the ledger's owner (never a value the
request names).
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, status
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from airflow_sky.errors import ClusterError, SpecError
from airflow_sky.hooks.fleet import SkyFleetHook
from airflow_sky.infra import catalog
from airflow_sky.ui import fleet
from airflow_sky.ui.cache import TtlCache
from airflow_sky.ui.run_jobs import RunNotFound, found_jobs, run_jobs
from airflow_sky.ui.sweeps import cancel_sweep


class CancelRequest(BaseModel):
    confirm: bool = False


log = logging.getLogger(__name__)

URL_PREFIX = "/airflow-sky"
STATIC = resources.files("airflow_sky.ui") / "static"

_answers = TtlCache()
_fleet_reads = TtlCache(ttl_s=3.0, entries=8)  # one read of every infra serves every open Sky page
FLEET_ACTIONS = ("down", "stop")
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

    @app.get("/api/v1/fleet", dependencies=[ReadRuns])
    def fleet_answer(
        user: GetUserDep, ended_hours: Annotated[float, Query(ge=0, le=24 * 30)] = 24.0
    ) -> dict[str, Any]:
        now = time.time()
        rows, notes = _fleet_reads.get(
            ended_hours, lambda: SkyFleetHook().read(ended_since=now - ended_hours * 3600)
        )
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        return fleet.shape(
            rows, notes, now, _edit_check(user), catalog.meta().get("as_of"), readable.__contains__
        )

    @app.post("/api/v1/fleet/clusters/{cluster}/{action}", dependencies=[ReadRuns])
    def cluster_action(
        cluster: str, action: str, infra: Annotated[str, Query()], body: CancelRequest, user: GetUserDep
    ) -> dict[str, Any]:
        if action not in FLEET_ACTIONS:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, f"no action {action!r}: {', '.join(FLEET_ACTIONS)}"
            )
        _confirmed(body, f"{action} cluster {cluster}")
        hook = SkyFleetHook()
        try:
            record = hook.cluster(infra, cluster).ledger_record()
        except (SpecError, ClusterError) as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
        owner = fleet.owner_dag((record or {}).get("owner"))
        if not _edit_check(user)(owner):
            raise HTTPException(status.HTTP_403_FORBIDDEN, _refusal(owner, f"{action} cluster {cluster}"))
        try:
            if action == "down":
                hook.down(infra, cluster, user.get_name(), log.info)
                done = True
            else:
                done = hook.stop(infra, cluster, user.get_name(), log.info)
        except ClusterError as err:
            raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from None
        _fleet_reads.clear()
        return {"cluster": cluster, "infra": infra, "action": action, "done": done, "by": user.get_name()}

    @app.post("/api/v1/fleet/jobs/{cluster}/{job_id}/cancel", dependencies=[ReadRuns])
    def job_cancel(
        cluster: str, job_id: int, infra: Annotated[str, Query()], body: CancelRequest, user: GetUserDep
    ) -> dict[str, Any]:
        _confirmed(body, f"cancel job {job_id}")
        hook = SkyFleetHook()
        try:
            dag_id = hook.job_dag(infra, cluster, job_id)
        except (SpecError, ClusterError) as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
        if not _edit_check(user)(dag_id):
            raise HTTPException(status.HTTP_403_FORBIDDEN, _refusal(dag_id, f"cancel job {job_id}"))
        try:
            done = hook.cancel_job(infra, cluster, job_id, user.get_name())
        except ClusterError as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
        _fleet_reads.clear()
        _answers.clear()
        return {
            "cluster": cluster,
            "infra": infra,
            "job_id": job_id,
            "cancelled": done,
            "by": user.get_name(),
        }

    @app.get("/fleet", dependencies=[ReadRuns], response_class=HTMLResponse)
    def fleet_page() -> HTMLResponse:
        return HTMLResponse((STATIC / "fleet.html").read_text(encoding="utf-8"))

    @app.get("/progress/{dag_id}/{run_id}", dependencies=[ReadRuns], response_class=HTMLResponse)
    def page(dag_id: str, run_id: str) -> HTMLResponse:
        # The page is static: its script reads the DAG, run and rank from its own URL (never pasted into HTML).
        return HTMLResponse((STATIC / "progress.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app


def _edit_check(user: Any) -> fleet.EditCheck:
    """Whether `user` may edit the runs of a DAG (None: of every DAG), as Airflow's auth manager says."""
    manager = get_auth_manager()

    def check(dag_id: str | None) -> bool:
        return bool(
            manager.is_authorized_dag(
                method="PUT", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user
            )
        )

    return check


def _confirmed(body: CancelRequest, what: str) -> None:
    # A JSON body: a plain cross-site form cannot send one without the browser asking first (CORS).
    if not body.confirm:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f'send {{"confirm": true}} to {what}')


def _refusal(dag_id: str | None, what: str) -> str:
    whose = f"the runs of DAG {dag_id!r}" if dag_id else "the runs of every DAG (no DAG here owns it)"
    return f"you may not {what}: it needs edit access to {whose}"


app = create_app()
