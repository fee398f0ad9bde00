"""`harel-edge dashboard`: a web view of one deployment over the library functions the commands
render (status, executions, workflows, dead letters). Read-only unless started with write mode,
which adds one action, requeueing a dead letter, behind a per-process form token."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from harel_edge import dead_letter, executions, workflows
from harel_edge.settings import EdgeSettings
from harel_edge.status import collect_status

TEMPLATES = Path(__file__).parent / "templates"
LIMIT = 200  # rows a list page shows


def create_app(settings: EdgeSettings, *, write: bool = False) -> Starlette:
    """The dashboard for the deployment `settings` reach; `write` allows requeueing dead letters."""
    pages = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    form_token = secrets.token_urlsafe(16)
    where = f"{settings.profile} at {settings.server or settings.db_path} (prefix {settings.prefix})"

    def page(name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        body = pages.get_template(name).render(where=where, write=write, form_token=form_token, **values)
        return HTMLResponse(body, status_code=status_code)

    def overview(request: Request) -> Response:
        return page("overview.html", report=collect_status(settings, top=10))

    def listing(template: str, states: tuple[str, ...], found: Callable[[str | None], list]) -> Callable:
        def endpoint(request: Request) -> Response:
            state = request.query_params.get("state") or None
            return page(template, rows=found(state), state=state, states=states)

        return endpoint

    def detail(template: str, what: str, show: Callable[[EdgeSettings, str], Any]) -> Callable:
        def endpoint(request: Request) -> Response:
            wanted = request.path_params["id"]
            found = show(settings, wanted)
            if found is None:
                return page("missing.html", 404, what=what, missing=wanted)
            return page(template, detail=found)

        return endpoint

    def dead_letters(request: Request) -> Response:
        return page("dead_letters.html", letters=dead_letter.read_dead_letters(settings, limit=LIMIT))

    async def requeue(request: Request) -> Response:
        if not write:
            raise HTTPException(403, "read-only: start the dashboard with --write to requeue")
        # The one field of an urlencoded form, read without python-multipart (Starlette's form parser).
        given = parse_qs((await request.body()).decode("utf-8", "replace")).get("form_token", [""])[0]
        if not secrets.compare_digest(given, form_token):
            raise HTTPException(403, "stale form: reload the page and try again")
        from starlette.concurrency import run_in_threadpool  # noqa: PLC0415

        number = int(request.path_params["id"])
        if await run_in_threadpool(dead_letter.requeue_dead_letter, settings, number) is None:
            raise HTTPException(404, f"no dead letter {number}")
        return RedirectResponse("/dead-letters", status_code=303)

    routes = [
        Route("/", overview),
        Route("/executions", listing("executions.html", executions.STATUSES, lambda state: executions.list_executions(
            settings, status=state, limit=LIMIT))),
        Route("/executions/{id:path}", detail("execution.html", "execution", executions.show_execution)),
        Route("/workflows", listing("workflows.html", workflows.STATES, lambda state: workflows.list_workflows(
            settings, state=state, limit=LIMIT))),
        Route("/workflows/{id:path}", detail("workflow.html", "workflow", workflows.show_workflow)),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/{id:int}/requeue", requeue, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def serve(settings: EdgeSettings, *, host: str = "127.0.0.1", port: int = 8800, write: bool = False) -> None:
    """Run the dashboard until Ctrl-C (uvicorn, one process)."""
    import uvicorn  # noqa: PLC0415

    uvicorn.run(create_app(settings, write=write), host=host, port=port, log_level="warning")
