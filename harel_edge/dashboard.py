"""`harel-edge dashboard`: a web view of one database, or of each of a deployment's under
/db/NAME/, over the library functions the commands render (status, executions, workflows, dead
letters). Read-only unless started with write mode, which adds the operator's actions (requeue a
dead letter; cancel, resume or fork a workflow), each behind a per-process form token."""

from __future__ import annotations

import functools
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
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from harel_edge import database_names, dead_letter, executions, workflow_control, workflows
from harel_edge.durable.control import CANCELS, COMMANDS, RESUMES
from harel_edge.errors import (
    AuthError,
    ConfigurationError,
    HarelEdgeError,
    NotFoundError,
    PrimaryUnavailableError,
)
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


@functools.cache
def templates() -> Environment:
    """The pages' templates, loaded once for every database a dashboard serves."""
    pages = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    pages.filters["link"] = id_link
    pages.filters["when"] = utc_text
    return pages


def render(name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    return HTMLResponse(templates().get_template(name).render(**values), status_code=status_code)


def where(settings: EdgeSettings) -> str:
    """What a page's header says it reads (a deployment's shows its `{database}` address)."""
    return f"{settings.profile} at {settings.server or settings.db_path} (prefix {settings.prefix})"


def stylesheet(request: Request) -> Response:
    return FileResponse(TEMPLATES / "dashboard.css", media_type="text/css")


def create_app(settings: EdgeSettings, *, write: bool = False, hosts: Iterable[str] = ()) -> Starlette:
    """The dashboard for what `settings` reach: one database's pages at /, or a deployment's list of
    databases at / and each one's pages under /db/NAME/; `write` allows the operator's actions;
    it answers for the loopback names and `hosts`."""
    form_token = secrets.token_urlsafe(16)
    guard = [Middleware(Guard, hosts=[*LOOPBACK_HOSTS, *hosts])]
    if not settings.is_deployment:
        return database_app(settings, write=write, form_token=form_token, middleware=guard)
    return deployment_app(settings, write=write, form_token=form_token, middleware=guard)


def database_app(
    settings: EdgeSettings, *, write: bool, form_token: str, root: str = "", middleware: Iterable[Middleware] = ()
) -> Starlette:
    """The pages of one database, at `root` (a deployment's `/db/NAME`, else the top): its own
    exception handlers, so a database that cannot be read says so on its own pages only."""
    shared = {"where": where(settings), "write": write, "form_token": form_token, "cancels": CANCELS, "resumes": RESUMES,
              "root": root, "deployment": bool(root), "database": settings.database if root else None}  # fmt: skip

    def page(name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        return render(name, status_code, **shared, **values)

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
        return RedirectResponse(f"{root}/dead-letters", status_code=303)

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
        Route("/style.css", stylesheet),
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
        middleware=list(middleware),
        exception_handlers={
            PrimaryUnavailableError: problem(503, "The primary cannot be reached", logged=True),
            AuthError: problem(503, "The primary refused the dashboard's token", logged=True),
            ConfigurationError: problem(400, "Not a page of this dashboard"),
            HarelEdgeError: problem(500, "The database cannot be used as it is", logged=True),  # no schema, say
        },  # fmt: skip
    )


class Databases:
    """The ASGI app under /db/NAME/: a listed database's pages, made when first asked for (its
    settings are built for a listed name only), and for any other name the list, as a 404."""

    def __init__(self, settings: EdgeSettings, *, write: bool, form_token: str) -> None:
        self.settings, self.write, self.form_token = settings, write, form_token
        self.apps: dict[str, ASGIApp] = {}

    def app(self, name: str) -> ASGIApp:
        if name not in self.apps:
            self.apps[name] = database_app(
                self.settings.for_database(name), write=self.write, form_token=self.form_token, root=f"/db/{name}"
            )
        return self.apps[name]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path_params"]["database"]
        if not (database_names.NAME.fullmatch(name) and name in self.settings.databases):
            answer: ASGIApp = deployment_page(self.settings, self.write, "databases.html", 404, missing=name)
        else:
            try:
                answer = self.app(name)
            except (HarelEdgeError, ValueError) as exc:  # not kept: the next request tries again
                log.warning("a database's settings were refused", database=name, error=str(exc).splitlines()[0])
                answer = deployment_page(self.settings, self.write, "problem.html", 500, database=name,
                                         title=f"The settings of {name} were refused", problem=str(exc))  # fmt: skip
        await answer(scope, receive, send)


def deployment_page(settings: EdgeSettings, write: bool, name: str, status_code: int = 200,
                    database: str | None = None, **values: Any) -> HTMLResponse:  # fmt: skip
    """A page of the deployment itself: the list of its databases (names and links only, none is
    read: there may be hundreds), or one database's settings refused."""
    return render(name, status_code, where=where(settings), write=write, root=f"/db/{database}" if database else "",
                  deployment=True, database=database, names=settings.databases, names_file=settings.databases_file,
                  **values)  # fmt: skip


def deployment_app(
    settings: EdgeSettings, *, write: bool, form_token: str, middleware: Iterable[Middleware] = ()
) -> Starlette:
    """A deployment's dashboard: its databases at /, each one's pages under /db/NAME/. The list is
    the one the settings held at start (HAREL_EDGE_DATABASES_FILE is not read again)."""
    routes = [
        Route("/", lambda request: deployment_page(settings, write, "databases.html")),
        Route("/style.css", stylesheet),
        Mount("/db/{database}", app=Databases(settings, write=write, form_token=form_token)),
    ]
    return Starlette(routes=routes, middleware=list(middleware))


def serve(
    settings: EdgeSettings, *, host: str = "127.0.0.1", port: int = 8800, write: bool = False, hosts: Iterable[str] = ()
) -> None:
    """Run the dashboard until Ctrl-C (uvicorn, one process)."""
    import uvicorn  # noqa: PLC0415

    uvicorn.run(create_app(settings, write=write, hosts=hosts), host=host, port=port, log_level="warning")
