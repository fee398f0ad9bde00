"""`harel-edge dashboard` on a deployment a worker really ran (the demo, then a failing execution
and a dead letter): every page answers with its data, renders in headless Chromium (a screenshot
of each), requeueing needs write mode and the page's form token, and what a page shows is escaped."""

from __future__ import annotations

import contextlib
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

from harel_edge import LibsqlTransport, dead_letter, executions
from harel_edge.dashboard import create_app
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
    "/workflows/fulfil-001": "Records",
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

    def __init__(self, settings: ExplicitSettings, *, write: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(settings, write=write), log_level="warning")
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
    refused = httpx.post(f"{read_only.url}/dead-letters/{letter.id}/requeue", data={"form_token": "x"}, timeout=30)
    assert refused.status_code == 403 and "--write" in refused.text
    assert dead_letter.read_dead_letters(deployment) == [letter], "nothing changed"


def test_write_mode_requeues_with_the_pages_form_token_only(deployment, tmp_path):
    copy = tmp_path / "copy.db"  # the shared database stays as the other tests expect it
    with contextlib.closing(sqlite3.connect(deployment.db_path)) as source, contextlib.closing(sqlite3.connect(copy)) as target:
        source.backup(target)  # its WAL too
    settings = ExplicitSettings.load(profile="local", db_path=str(copy))
    (letter,) = dead_letter.read_dead_letters(settings)
    with Served(settings, write=True) as served:
        page = httpx.get(served.url + "/dead-letters", timeout=30).text
        token = page.split('name="form_token" value="')[1].split('"')[0]
        stale = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": "stale"}, timeout=30)
        assert stale.status_code == 403
        done = httpx.post(f"{served.url}/dead-letters/{letter.id}/requeue", data={"form_token": token}, timeout=30)
        assert done.status_code == 303
    assert dead_letter.read_dead_letters(settings) == [], "requeued: back in the queue"


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


def test_the_command_serves_on_loopback_and_stops_on_ctrl_c(deployment, tmp_path):
    with socket.socket() as probe:  # a port free now; the command binds it a moment later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = env_for({"profile": "local", "db_path": deployment.db_path})
    process = subprocess.Popen(  # noqa: S603
        [COMMAND, "dashboard", "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1]
                return False

        wait_until(answers, timeout=60, interval=0.1, what="the dashboard command to answer")
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert f"dashboard on http://127.0.0.1:{port}/ (read-only)" in stdout
