"""`harel-edge dashboard`: a web view of one deployment over the library functions the commands
render (status, executions, workflows, dead letters). Read-only unless started with write mode,
which adds the operator's actions (requeue a dead letter; cancel, resume or fork a workflow),
each behind a per-process form token."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import structlog
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from harel_edge import dead_letter, executions, workflow_control, workflows
from harel_edge.durable.control import CANCELS, COMMANDS, RESUMES
from harel_edge.errors import AuthError, ConfigurationError, NotFoundError, PrimaryUnavailableError
from harel_edge.settings import EdgeSettings
from harel_edge.status import collect_status
from harel_edge.timestamps import utc_text

log = structlog.get_logger("harel_edge.dashboard")

TEMPLATES = Path(__file__).parent / "templates"
LIMIT = 200  # rows a list page shows
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Every page: never framed (clickjacking), no script at all, styles and forms from itself only.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",  # a write page holds the form token
}


def hostname(netloc: str) -> str | None:
    """The host of a Host header or an origin's netloc (`[::1]:8800` -> `::1`), or None if malformed."""
    try:
        return urlsplit(f"//{netloc}").hostname
    except ValueError:
        return None


def id_link(base: str, value: str) -> str:
    """The link to `value`'s own page: every character a path gives meaning to is percent-encoded
    (`/`, `?`, `#`, `%`); an id of dots alone, which a browser would resolve as `.` or `..`
    however it is encoded, goes as the query's `id`."""
    if value.strip(".") == "":
        return f"{base}/?id={quote(value, safe='')}"
    return f"{base}/{quote(value, safe='')}"


class Guard(BaseHTTPMiddleware):
    """DNS rebinding and cross-site writes: a request must name one of the hosts the dashboard is
    for, and a write must come from a page of its own origin. Every answer gets HEADERS."""

    def __init__(self, app: Any, hosts: Iterable[str]) -> None:
        super().__init__(app)
        self.hosts = {h.lower().strip("[]") for h in hosts}

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        answer = self.refusal(request) or await call_next(request)
        answer.headers.update(HEADERS)
        return answer

    def refusal(self, request: Request) -> Response | None:
        host = request.headers.get("host", "")
        if hostname(host) not in self.hosts:
            return PlainTextResponse(
                f"unknown Host {host!r}: this dashboard answers for {', '.join(sorted(self.hosts))}; "
                "start it with --allow-host NAME for another name", status_code=400,
            )  # fmt: skip
        if request.method in ("GET", "HEAD"):
            return None
        origin = request.headers.get("origin", "")
        if urlsplit(origin).netloc.lower() != host.lower():
            return PlainTextResponse(
                f"refused: a write must come from this dashboard's own page (Origin {origin or 'missing'!r})",
                status_code=403,
            )
        return None


def create_app(settings: EdgeSettings, *, write: bool = False, hosts: Iterable[str] = ()) -> Starlette:
    """The dashboard for the deployment `settings` reach; `write` allows the operator's actions;
    it answers for the loopback names and `hosts`."""
    pages = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    pages.filters["link"] = id_link
    pages.filters["when"] = utc_text
    form_token = secrets.token_urlsafe(16)
    where = f"{settings.profile} at {settings.server or settings.db_path} (prefix {settings.prefix})"

    def page(name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        body = pages.get_template(name).render(
            where=where, write=write, form_token=form_token, cancels=CANCELS, resumes=RESUMES, **values
        )
        return HTMLResponse(body, status_code=status_code)

    def problem(status_code: int, title: str, logged: bool = False) -> Callable[[Request, Exception], Response]:
        def handler(request: Request, exc: Exception) -> Response:
            if logged:  # one line, not a traceback: the page says the rest
                log.warning(title, path=request.url.path, error=str(exc).splitlines()[0])
            return page("problem.html", status_code, title=title, problem=str(exc))

        return handler

    def numbered(request: Request) -> int:
        """The `?page=` asked for, from 1."""
        given = request.query_params.get("page", "1")
        if not given.isdigit() or int(given) < 1:
            raise ConfigurationError(f"?page={given!r}: give a page number from 1")
        return int(given)

    def paged(template: str, request: Request, rows: Any, number: int, **values: Any) -> Response:
        shown = (number - 1) * LIMIT

        def at(n: int) -> str:
            url = request.url.include_query_params(page=n)
            return f"{url.path}?{url.query}"

        return page(
            template, rows=rows, first=shown + 1, last=shown + len(rows), total=rows.total, number=number,
            previous=at(number - 1) if number > 1 else None,
            next=at(number + 1) if shown + len(rows) < rows.total else None, first_page=at(1), **values,
        )  # fmt: skip

    def overview(request: Request) -> Response:
        return page("overview.html", report=collect_status(settings, top=10))

    def listing(template: str, states: tuple[str, ...], found: Callable[[str | None, int], Any]) -> Callable:
        def endpoint(request: Request) -> Response:
            state, number = request.query_params.get("state") or None, numbered(request)
            if state is not None and state.lower() not in states:
                raise ConfigurationError(f"?state={state!r}: use one of {', '.join(states)}")
            return paged(template, request, found(state, (number - 1) * LIMIT), number, state=state, states=states)

        return endpoint

    def detail(template: str, what: str, show: Callable[[EdgeSettings, str], Any]) -> Callable:
        def endpoint(request: Request) -> Response:
            wanted = request.path_params["id"] or request.query_params.get("id", "")
            found = show(settings, wanted) if wanted else None
            if found is None:
                return page("missing.html", 404, what=what, missing=wanted)
            return page(template, detail=found)

        return endpoint

    def dead_letters(request: Request) -> Response:
        number = numbered(request)
        found = dead_letter.read_dead_letters(settings, limit=LIMIT, offset=(number - 1) * LIMIT)
        return paged("dead_letters.html", request, found, number)

    async def posted(request: Request, action: str) -> dict[str, str]:
        """The fields of a write's urlencoded form (read without python-multipart, Starlette's
        form parser), once write mode and the page's form token are checked."""
        if not write:
            raise HTTPException(403, f"read-only: start the dashboard with --write to {action}")
        fields = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
        if not secrets.compare_digest(fields.get("form_token", ""), form_token):
            raise HTTPException(403, "stale form: reload the page and try again")
        return fields

    async def requeue(request: Request) -> Response:
        await posted(request, "requeue")
        number = int(request.path_params["id"])
        if await run_in_threadpool(dead_letter.requeue_dead_letter, settings, number) is None:
            raise HTTPException(404, f"no dead letter {number}")
        return RedirectResponse("/dead-letters", status_code=303)

    def control(command: str) -> Callable:
        """The endpoint that cancels, resumes or forks the workflow its form names, and says what changed."""

        async def endpoint(request: Request) -> Response:
            fields = await posted(request, command)
            workflow = fields.get("id", "")
            args = (fields.get("step", ""), fields.get("new_id") or None) if command == "fork" else ()
            try:
                change = await run_in_threadpool(getattr(workflow_control, f"{command}_workflow"), settings, workflow, *args)
            except NotFoundError as exc:
                return page("missing.html", 404, what="workflow", missing=workflow, problem=str(exc))
            except ConfigurationError as exc:
                return page("problem.html", 409, title=f"The {command} was refused", problem=str(exc))
            return page("changed.html", change=change)

        return endpoint

    routes = [
        Route("/", overview),
        Route("/style.css", lambda request: FileResponse(TEMPLATES / "dashboard.css", media_type="text/css")),
        Route("/executions", listing("executions.html", executions.STATUSES, lambda state, offset: executions.list_executions(
            settings, status=state, limit=LIMIT, offset=offset))),
        Route("/executions/{id:path}", detail("execution.html", "execution", executions.show_execution)),
        Route("/workflows", listing("workflows.html", workflows.STATES, lambda state, offset: workflows.list_workflows(
            settings, state=state, limit=LIMIT, offset=offset))),
        *(Route(f"/workflows/{command}", control(command), methods=["POST"]) for command in COMMANDS),
        Route("/workflows/{id:path}", detail("workflow.html", "workflow", workflows.show_workflow)),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/{id:int}/requeue", requeue, methods=["POST"]),
    ]  # fmt: skip
    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, hosts=[*LOOPBACK_HOSTS, *hosts])],
        exception_handlers={
            PrimaryUnavailableError: problem(503, "The primary cannot be reached", logged=True),
            AuthError: problem(503, "The primary refused the dashboard's token", logged=True),
            ConfigurationError: problem(400, "Not a page of this dashboard"),
        },  # fmt: skip
    )


def serve(
    settings: EdgeSettings, *, host: str = "127.0.0.1", port: int = 8800, write: bool = False, hosts: Iterable[str] = ()
) -> None:
    """Run the dashboard until Ctrl-C (uvicorn, one process)."""
    import uvicorn  # noqa: PLC0415

    uvicorn.run(create_app(settings, write=write, hosts=hosts), host=host, port=port, log_level="warning")
