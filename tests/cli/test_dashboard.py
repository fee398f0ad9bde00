"""`harel-edge dashboard` on a deployment a worker really ran (the demo, then a failing execution
and a dead letter): every page answers with its data, renders in headless Chromium (a screenshot
of each), requeueing needs write mode and the page's form token, and what a page shows is escaped."""

from __future__ import annotations

import contextlib
import html
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from cli_helpers import COMMAND, env_for, run
from harel.engine.execution import Execution
from harel.spec.states import Event

from harel_edge import LibsqlTransport, dashboard, dead_letter, executions
from harel_edge.dashboard import create_app
from harel_edge.migration import migrate
from harel_edge.settings import ExplicitSettings
from harel_edge.store import EdgeStore
from harel_edge.testing import wait_until
from harel_edge.testing.fixtures import built_once

EXAMPLES = str(Path(__file__).resolve().parents[2] / "harel_edge" / "examples")
PAGES = {  # path: a text the page must show (from the deployment's data)
    "/": "Workers",
    "/executions": "order-001",
    "/executions/order-001": "Delivered",
    "/executions/odd-1": "amount",
    "/workflows": "fulfil-001",
    "/workflows/fulfil-001": "Steps, in the order recorded",
    "/dead-letters": "unknown machine",
}


def build_deployment(tmp: Path) -> None:
    """The demo's database (orders delivered, workflows finished), plus an execution that failed
    (Pay without an amount) with an event queued behind it, and an event dead-lettered (its
    machine unknown to the worker)."""
    db = tmp / "demo.db"
    assert run(["demo", "--db", str(db), "--orders", "3", "--workflows", "2"], env_for({}), tmp, timeout=120).returncode == 0
    env = env_for({"profile": "local", "db_path": str(db)})
    for args in (
        ["publish", "odd-1", "Start", "--create", "order", "-D", EXAMPLES],
        ["publish", "odd-1", "Pay"],
    ):
        assert run(args, env, tmp).returncode == 0
    settings = ExplicitSettings.load(profile="local", db_path=str(db))
    with EdgeStore(settings) as store, LibsqlTransport(settings=settings) as transport:
        store.save(Execution(id="lost-1", definition_id="nosuchmachine"))  # made by a newer deploy, say
        transport.publish("lost-1", Event(kind="Start"))
    worker = subprocess.Popen(  # noqa: S603
        [COMMAND, "worker", "-D", EXAMPLES], env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: executions.show_execution(settings, "odd-1").summary.status == "FAILED"
            and dead_letter.read_dead_letters(settings),
            timeout=60, interval=0.1, what="the failed execution and the dead letter",
        )  # fmt: skip
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    # Queued after the worker stopped: an event whose id is markup, which a page must show as text.
    assert run(["publish", "odd-1", "Ship", "--id", "<b>bold?</b>"], env, tmp).returncode == 0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> ExplicitSettings:
    """The deployment, built once for the run (the pytest-xdist workers share it; tests read it)."""
    root = built_once(tmp_path_factory, "dashboard-deployment", build_deployment)
    return ExplicitSettings.load(profile="local", db_path=str(root / "demo.db"))


class Served:
    """The dashboard app served by uvicorn on a thread, on a loopback port the kernel picked."""

    def __init__(self, settings: ExplicitSettings, *, write: bool, hosts: tuple[str, ...] = ()) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(settings, write=write, hosts=hosts), log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30, interval=0.05, what="the dashboard to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def read_only(deployment) -> Iterator[Served]:
    with Served(deployment, write=False) as served:
        yield served


@pytest.mark.parametrize("path", list(PAGES))
def test_each_page_answers_with_the_deployments_data(read_only, path):
    page = httpx.get(read_only.url + path, timeout=30)
    assert page.status_code == 200, page.text[:300]
    assert PAGES[path] in page.text
    assert "read-only" in page.text


def test_what_a_page_shows_is_escaped(read_only):
    page = httpx.get(read_only.url + "/executions/odd-1", timeout=30).text
    assert "&lt;b&gt;bold?&lt;/b&gt;" in page, "the queued event's id, escaped"
    assert "<b>bold?</b>" not in page


def test_an_unknown_execution_is_a_404_page_that_links_back(read_only):
    page = httpx.get(read_only.url + "/executions/nobody", timeout=30)
    assert page.status_code == 404 and "No execution nobody" in page.text


def test_read_only_shows_no_requeue_and_refuses_one(read_only, deployment):
    (letter,) = dead_letter.read_dead_letters(deployment)
    assert "<button>requeue</button>" not in httpx.get(read_only.url + "/dead-letters", timeout=30).text
    refused = httpx.post(f"{read_only.url}/dead-letters/{letter.id}/requeue", data={"form_token": "x"},
                         headers={"Origin": read_only.url}, timeout=30)  # fmt: skip
    assert refused.status_code == 403 and "--write" in refused.text
    assert dead_letter.read_dead_letters(deployment) == [letter], "nothing changed"


def writable_copy(deployment: ExplicitSettings, tmp_path: Path) -> ExplicitSettings:
    """The deployment copied, so a test may change it while the others read the shared one."""
    copy = tmp_path / "copy.db"
    with contextlib.closing(sqlite3.connect(deployment.db_path)) as source, contextlib.closing(sqlite3.connect(copy)) as target:
        source.backup(target)  # its WAL too
    return ExplicitSettings.load(profile="local", db_path=str(copy))


def test_write_mode_requeues_with_the_pages_form_token_only(deployment, tmp_path):
    settings = writable_copy(deployment, tmp_path)
    (letter,) = dead_letter.read_dead_letters(settings)
    with Served(settings, write=True) as served:
        page = httpx.get(served.url + "/dead-letters", timeout=30).text
        token = page.split('name="form_token" value="')[1].split('"')[0]
        own = {"Origin": served.url}  # what a browser sends with the page's form
        stale = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": "stale"}, headers=own, timeout=30)
        assert stale.status_code == 403
        done = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": token}, headers=own, timeout=30)
        assert done.status_code == 303
    assert dead_letter.read_dead_letters(settings) == [], "requeued: back in the queue"


def test_write_mode_cancels_resumes_and_forks_a_workflow_and_says_what_each_changed(deployment, tmp_path):
    from harel_edge import workflows

    settings = writable_copy(deployment, tmp_path)
    with Served(settings, write=True) as served:
        page = httpx.get(served.url + "/workflows/fulfil-001", timeout=30).text
        token = page.split('name="form_token" value="')[1].split('"')[0]
        assert 'action="/workflows/fork"' in page and 'action="/workflows/cancel"' not in page, "finished: fork only"
        own = {"Origin": served.url}

        def post(command: str, **fields: str) -> httpx.Response:
            return httpx.post(f"{served.url}/workflows/{command}", data={"form_token": token, **fields}, headers=own, timeout=30)

        first_step = workflows.show_workflow(settings, "fulfil-001").records[0]["step"]
        forked = post("fork", id="fulfil-001", step=first_step, new_id="fulfil-again")
        assert forked.status_code == 200 and "Forked fulfil-001 as fulfil-again" in forked.text
        assert workflows.show_workflow(settings, "fulfil-again").summary.state == "ready"
        assert 'action="/workflows/cancel"' in httpx.get(served.url + "/workflows/fulfil-again", timeout=30).text
        cancelled = post("cancel", id="fulfil-again")
        assert cancelled.status_code == 200 and "fulfil-again: ready → cancelled" in cancelled.text
        assert "cancel changed nothing" in post("cancel", id="fulfil-again").text
        assert 'action="/workflows/resume"' in httpx.get(served.url + "/workflows/fulfil-again", timeout=30).text
        assert "fulfil-again: cancelled → ready" in post("resume", id="fulfil-again").text
        refused = post("fork", id="fulfil-001", step="no such step")
        assert refused.status_code == 409 and "recorded no step" in refused.text
        assert post("cancel", id="nobody").status_code == 404
        stale = httpx.post(f"{served.url}/workflows/cancel", data={"form_token": "stale", "id": "fulfil-again"}, headers=own, timeout=30)
        no_origin = httpx.post(f"{served.url}/workflows/cancel", data={"form_token": token, "id": "fulfil-again"}, timeout=30)
        assert (stale.status_code, no_origin.status_code) == (403, 403)
    assert workflows.show_workflow(settings, "fulfil-again").summary.state == "ready", "the refused posts changed nothing"
    with Served(settings, write=False) as served:
        assert 'action="/workflows/' not in httpx.get(served.url + "/workflows/fulfil-again", timeout=30).text
        refused = httpx.post(f"{served.url}/workflows/cancel", data={"form_token": "x", "id": "fulfil-again"},
                             headers={"Origin": served.url}, timeout=30)  # fmt: skip
        assert refused.status_code == 403 and "--write" in refused.text


def chromium_dom(url: str, tmp_path: Path) -> str:
    """The DOM headless Chromium draws for `url`, as it resolves the URL."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (.ci/run and `make test` install it)")
    done = subprocess.run(  # noqa: S603
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'chromium'}",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]
    return done.stdout


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def screenshot(url: str, path: Path) -> bytes:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (.ci/run and `make test` install it)")
    done = subprocess.run(  # noqa: S603
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={path}", "--window-size=1280,900", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and path.exists(), done.stderr[-500:]
    return path.read_bytes()


def test_every_page_renders_in_headless_chromium(read_only, tmp_path):
    blank = screenshot("about:blank", tmp_path / "blank.png")
    for path in PAGES:
        name = path.strip("/").replace("/", "-") or "overview"
        shot = screenshot(read_only.url + path, tmp_path / f"{name}.png")
        assert png_size(shot) == (1280, 900)
        # A page drawn with its tables and text compresses far worse than an empty one.
        assert len(shot) > 3 * len(blank), f"{path} looks empty: {len(shot)} bytes against {len(blank)} blank"
        print(f"screenshot of {path}: {tmp_path / f'{name}.png'}")


@contextlib.contextmanager
def dashboard_command(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[int, list[str]]]:
    """`harel-edge dashboard` running on a free loopback port until the block ends (Ctrl-C then,
    and its exit code checked); the list gets what it printed."""
    with socket.socket() as probe:  # a port free now; the command binds it a moment later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(  # noqa: S603
        [COMMAND, "dashboard", "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    printed: list[str] = []
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1]
                return False

        wait_until(answers, timeout=60, interval=0.1, what="the dashboard command to answer")
        yield port, printed
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        printed.append(stdout)
    assert process.returncode == 0, stderr


def test_the_command_serves_on_loopback_and_stops_on_ctrl_c(deployment, tmp_path):
    env = env_for({"profile": "local", "db_path": deployment.db_path})
    with dashboard_command(env, tmp_path) as (port, printed):
        pass
    assert f"dashboard on http://127.0.0.1:{port}/ (read-only)" in printed[0]


# ---- the guards: hosts, origins, framing ----------------------------------------------------------


def test_a_request_naming_another_host_is_refused_so_a_rebound_name_reads_nothing_and_requeues_nothing(deployment, tmp_path):
    settings = writable_copy(deployment, tmp_path)
    (letter,) = dead_letter.read_dead_letters(settings)
    with Served(settings, write=True) as served:
        evil = {"Host": "evil.example", "Origin": "http://evil.example"}  # a page whose name resolves to 127.0.0.1
        page = httpx.get(served.url + "/dead-letters", headers=evil, timeout=30)
        assert page.status_code == 400 and "unknown Host 'evil.example'" in page.text and "form_token" not in page.text
        token = httpx.get(served.url + "/dead-letters", timeout=30).text.split('name="form_token" value="')[1].split('"')[0]
        posted = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": token}, headers=evil, timeout=30)
        assert posted.status_code == 400
        for origin in ("http://evil.example", f"http://127.0.0.1:{served.port + 1}", None):  # another site, port, none
            headers = {"Origin": origin} if origin else {}
            posted = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": token}, headers=headers, timeout=30)
            assert posted.status_code == 403 and "own page" in posted.text, (origin, posted.text)
        assert dead_letter.read_dead_letters(settings) == [letter], "nothing was requeued"
        for host in (f"localhost:{served.port}", f"[::1]:{served.port}", f"LOCALHOST:{served.port}"):
            assert httpx.get(served.url + "/", headers={"Host": host}, timeout=30).status_code == 200, host


def test_a_host_allowed_by_name_is_answered_and_its_own_origin_may_write(deployment, tmp_path):
    settings = writable_copy(deployment, tmp_path)
    (letter,) = dead_letter.read_dead_letters(settings)
    with Served(settings, write=True, hosts=("dash.internal",)) as served:
        own = {"Host": f"dash.internal:{served.port}"}
        page = httpx.get(served.url + "/dead-letters", headers=own, timeout=30)
        assert page.status_code == 200
        token = page.text.split('name="form_token" value="')[1].split('"')[0]
        done = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": token},
                          headers={**own, "Origin": f"http://dash.internal:{served.port}"}, timeout=30)  # fmt: skip
        assert done.status_code == 303
    assert dead_letter.read_dead_letters(settings) == []


@pytest.mark.parametrize("path", [*PAGES, "/executions/nobody", "/style.css"])
def test_every_answer_forbids_framing_and_scripts(read_only, path):
    answer = httpx.get(read_only.url + path, timeout=30)
    assert answer.headers["x-frame-options"] == "DENY"
    policy = answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy and "script-src" not in policy
    assert answer.headers["x-content-type-options"] == "nosniff"


# ---- clear answers: bad queries, odd ids, capped lists, the primary down --------------------------


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/executions?state=nosuch", "?state=&#39;nosuch&#39;: use one of pending"),
        ("/workflows?state=nosuch", "?state=&#39;nosuch&#39;: use one of ready, sleeping, running, waiting, finished, dead, cancelled"),
        ("/executions?page=0", "give a page number from 1"),
        ("/dead-letters?page=x", "give a page number from 1"),
    ],
)
def test_a_query_the_dashboard_cannot_answer_is_a_400_saying_what_to_give(read_only, path, says):
    answer = httpx.get(read_only.url + path, timeout=30)
    assert answer.status_code == 400 and says in answer.text, answer.text[-800:]


ODD_IDS = ("order#42", "a?state=failed", "pct%2Fx", "evil/../victim", "victim", "..", ".", "two words", "<i>x</i>")


@pytest.fixture
def odd_ids(tmp_path) -> ExplicitSettings:
    """A deployment whose executions have ids that mean something in a URL."""
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "odd.db"))
    migrate(settings)
    with EdgeStore(settings) as store:
        for name in ODD_IDS:
            store.save(Execution(id=name, definition_id="order"))
    return settings


def execution_links(listing: str) -> dict[str, str]:
    """Each row's link on an executions page, by the id the row shows (as the page escapes it)."""
    return dict(
        (html.unescape(text), html.unescape(href))
        for href, text in re.findall(r'<tr><td><a href="([^"]+)">([^<]*)</a></td>', listing)
    )


def test_each_link_to_an_execution_opens_its_own_page_whatever_its_id_holds(odd_ids, tmp_path):
    with Served(odd_ids, write=False) as served:
        links = execution_links(httpx.get(served.url + "/executions", timeout=30).text)
        assert sorted(links) == sorted(ODD_IDS)
        for name, href in links.items():
            page = httpx.get(served.url + href, timeout=30)
            assert page.status_code == 200 and f"<h1>Execution {html.escape(name)}</h1>" in page.text, (name, href)
        for name in ("evil/../victim", "..", "pct%2Fx", "a?state=failed"):  # as a browser resolves the link
            dom = chromium_dom(served.url + links[name], tmp_path)
            assert f"<h1>Execution {html.escape(name, quote=False)}</h1>" in dom, (name, dom[-600:])


def test_a_capped_list_says_how_many_there_are_and_pages_through_them(odd_ids, deployment, monkeypatch):
    monkeypatch.setattr(dashboard, "LIMIT", 4)
    with Served(odd_ids, write=False) as served:
        first = httpx.get(served.url + "/executions", timeout=30).text
        assert "1&ndash;4 of 9." in first and "previous page" not in first
        seen = list(execution_links(first))
        second = httpx.get(served.url + re.search(r'<a href="([^"]+)">next page</a>', first).group(1), timeout=30).text
        assert "5&ndash;8 of 9." in second and "previous page" in second
        seen += execution_links(second)
        third = httpx.get(served.url + "/executions?page=3", timeout=30).text
        assert "9&ndash;9 of 9." in third and "next page" not in third
        seen += execution_links(third)
        assert sorted(seen) == sorted(ODD_IDS), "every execution on exactly one page"
        past = httpx.get(served.url + "/executions?page=4", timeout=30)
        assert past.status_code == 200 and "Page 4 is past the end" in past.text
    monkeypatch.setattr(dashboard, "LIMIT", 1)
    with Served(deployment, write=False) as served:
        workflows_page = httpx.get(served.url + "/workflows?state=finished", timeout=30).text
        assert "1&ndash;1 of 2." in workflows_page and "/workflows?state=finished&amp;page=2" in workflows_page


@pytest.mark.sqld
def test_the_dashboard_says_the_primary_cannot_be_reached_and_comes_back_with_it(fresh_sqld_primary, tmp_path, capfd):
    server = fresh_sqld_primary
    settings = ExplicitSettings.load(
        profile="sqld", url=server.http_url, auth_token=server.rw_token, retry_attempts=2, retry_deadline=1.0
    )
    with LibsqlTransport(settings=settings) as transport:
        transport.publish("g", Event(kind="E"))
    with Served(settings, write=False) as served:
        assert httpx.get(served.url + "/", timeout=30).status_code == 200
        server.stop()
        for path in ("/", "/executions", "/dead-letters"):
            down = httpx.get(served.url + path, timeout=60)
            assert down.status_code == 503, down.text[-500:]
            assert "The primary cannot be reached" in down.text and server.http_url in down.text
            assert server.rw_token not in down.text
        server.restart()
        assert "1 message in 1 group" in httpx.get(served.url + "/", timeout=60).text
    logged = capfd.readouterr()
    assert "Traceback" not in logged.out + logged.err
    assert (logged.out + logged.err).count("The primary cannot be reached") == 3, "one line a request"
    assert server.rw_token not in logged.out + logged.err


# ---- a deployment of many databases: the list at /, each one's pages under /db/NAME/ ------------


@pytest.fixture
def tenants(tmp_path) -> ExplicitSettings:
    """A deployment of two local files, a and b: a holds an execution and an event queued for it,
    b nothing."""
    settings = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "{database}.db"), databases="a,b")
    for name in settings.databases:
        migrate(settings.for_database(name))
    a = settings.for_database("a")
    with EdgeStore(a) as store, LibsqlTransport(settings=a) as transport:
        store.save(Execution(id="only-in-a", definition_id="order"))
        transport.publish("only-in-a", Event(kind="Start"))
    return settings


def test_a_deployments_dashboard_lists_its_databases_with_a_link_to_each(tenants):
    with Served(tenants, write=False) as served:
        page = httpx.get(served.url + "/", timeout=30)
    assert page.status_code == 200
    assert '<a href="/db/a/">a</a>' in page.text and '<a href="/db/b/">b</a>' in page.text
    assert "2 databases" in page.text and 'href="/executions"' not in page.text, "no database's own pages at the top"


def test_a_deployment_named_in_a_file_lists_the_databases_the_file_held_at_start(tenants, tmp_path):
    names = tmp_path / "databases"
    names.write_text("a\n# b is next\nb\n")
    settings = ExplicitSettings.load(profile="local", db_path=tenants.db_path, databases_file=str(names))
    with Served(settings, write=False) as served:
        names.write_text("a\n")
        page = httpx.get(served.url + "/", timeout=30).text
        b = httpx.get(served.url + "/db/b/", timeout=30)
    assert '<a href="/db/a/">a</a>' in page and '<a href="/db/b/">b</a>' in page
    assert "HAREL_EDGE_DATABASES_FILE named them when the dashboard started" in page
    assert b.status_code == 200 and "database b" in b.text


def test_each_databases_pages_show_its_own_data_and_not_the_others(tenants):
    with Served(tenants, write=False) as served:
        a_overview = httpx.get(served.url + "/db/a/", timeout=30).text
        b_overview = httpx.get(served.url + "/db/b/", timeout=30).text
        a_list = httpx.get(served.url + "/db/a/executions", timeout=30).text
        b_list = httpx.get(served.url + "/db/b/executions", timeout=30)
        a_one = httpx.get(served.url + "/db/a/executions/only-in-a", timeout=30)
        b_one = httpx.get(served.url + "/db/b/executions/only-in-a", timeout=30)
    assert "1 message in 1 group" in a_overview and "0 messages in 0 groups" in b_overview
    assert "database a" in a_overview and "database b" in b_overview, "each page says which database"
    assert '<a href="/">databases</a>' in a_overview and '<a href="/db/a/executions">executions</a>' in a_overview
    assert '<a href="/db/a/executions/only-in-a">only-in-a</a>' in a_list
    assert b_list.status_code == 200 and "only-in-a" not in b_list.text
    assert a_one.status_code == 200 and "<h1>Execution only-in-a</h1>" in a_one.text
    assert b_one.status_code == 404 and 'href="/db/b/executions"' in b_one.text, "b's 404 links to b's list"


def test_an_unknown_database_is_a_404_listing_the_databases_and_creates_no_file(tenants, tmp_path):
    before = sorted(p.name for p in tmp_path.iterdir())
    with Served(tenants, write=False) as served:
        for name in ("c", "A", "no%20such", "a.db", "-a"):
            page = httpx.get(f"{served.url}/db/{name}/executions", timeout=30)
            assert page.status_code == 404, (name, page.text[-300:])
            assert "No database" in page.text and '<a href="/db/a/">a</a>' in page.text and '<a href="/db/b/">b</a>' in page.text
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no database file made for a name not listed"


def test_a_database_that_cannot_be_read_says_so_on_its_own_pages_only(tenants, tmp_path):
    gone = ExplicitSettings.load(profile="local", db_path=str(tmp_path / "{database}.db"), databases="a,b,gone")
    with Served(gone, write=False) as served:
        broken = httpx.get(served.url + "/db/gone/", timeout=30)
        listing = httpx.get(served.url + "/", timeout=30)
        other = httpx.get(served.url + "/db/a/executions", timeout=30)
    assert broken.status_code == 500 and "no database at" in broken.text and "database gone" in broken.text
    assert listing.status_code == 200 and '<a href="/db/gone/">gone</a>' in listing.text
    assert other.status_code == 200 and "only-in-a" in other.text
    assert not (tmp_path / "gone.db").exists(), "reading it made no file"


def test_a_write_on_a_databases_page_changes_that_database_and_goes_back_to_its_page(tenants):
    b = tenants.for_database("b")
    with LibsqlTransport(settings=b) as transport:
        transport.publish("lost-in-b", Event(kind="Start"))
        transport.bury(transport.claim("test", 30.0))
    (letter,) = dead_letter.read_dead_letters(b)
    with Served(tenants, write=True) as served:
        page = httpx.get(served.url + "/db/b/dead-letters", timeout=30).text
        assert f'action="/db/b/dead-letters/{letter.id}/requeue"' in page
        token = page.split('name="form_token" value="')[1].split('"')[0]
        own = {"Origin": served.url}
        stale = httpx.post(f"{served.url}/db/b/dead-letters/{letter.id}/requeue", data={"form_token": "stale"}, headers=own, timeout=30)
        done = httpx.post(f"{served.url}/db/b/dead-letters/{letter.id}/requeue", data={"form_token": token}, headers=own, timeout=30)
    assert stale.status_code == 403
    assert done.status_code == 303 and done.headers["location"] == "/db/b/dead-letters"
    assert dead_letter.read_dead_letters(b) == [], "requeued in b"


def test_a_single_database_and_a_database_chosen_from_a_deployment_keep_the_pages_at_the_top(tenants):
    for settings in (ExplicitSettings.load(profile="local", db_path=tenants.for_database("a").db_path), tenants.for_database("a")):
        with Served(settings, write=False) as served:
            overview = httpx.get(served.url + "/", timeout=30).text
            listing = httpx.get(served.url + "/executions", timeout=30).text
            nested = httpx.get(served.url + "/db/a/", timeout=30)
        assert "1 message in 1 group" in overview and '<a href="/executions">executions</a>' in overview
        assert ">databases</a>" not in overview
        assert '<a href="/executions/only-in-a">only-in-a</a>' in listing
        assert nested.status_code == 404


def test_the_command_on_a_deployment_serves_the_list_without_reading_every_database(tenants, tmp_path):
    env = env_for({"profile": "local", "db_path": tenants.db_path, "databases": "a,b,not-made-yet"})
    with dashboard_command(env, tmp_path) as (port, printed):
        listing = httpx.get(f"http://127.0.0.1:{port}/", timeout=30).text
        overview = httpx.get(f"http://127.0.0.1:{port}/db/a/", timeout=30).text
    assert '<a href="/db/not-made-yet/">not-made-yet</a>' in listing and "1 message in 1 group" in overview
    assert f"dashboard on http://127.0.0.1:{port}/ (read-only; 3 databases, each under /db/NAME/)" in printed[0]
