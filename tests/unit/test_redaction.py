"""No token leaves the process: not in an error's text, not in any log line, whatever the status
of the answer that echoed it (a gateway in front of the primary may echo the request's headers)."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest
import structlog
from aiohttp import web

from harel_edge import logs, retry
from harel_edge.errors import PrimaryUnavailableError
from harel_edge.executor import Stmt
from harel_edge.executor.remote import HranaExecutor
from harel_edge.redaction import MARK, scrub
from harel_edge.settings import ExplicitSettings
from harel_edge.testing.http import loopback_http

TOKEN = "eyJhbGciOiJFZERTQSJ9.eyJhIjoicncifQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"


def echoing_gateway(status: int):
    """A gateway in front of the primary that answers `status` with the request's headers in its body."""

    async def answer(request: web.BaseRequest) -> web.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in request.headers.items())
        return web.Response(status=status, text=f"bad gateway; your request was:\n{headers}")

    return answer


@pytest.fixture
def log_lines():
    """Every line this process logs, rendered as the worker renders them (JSON)."""
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logs.configure_logging("json", "debug", stream=stream)
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.parametrize("status", [502, 500, 429, 401, 400])
def test_a_gateway_echoing_the_authorization_header_puts_the_token_in_no_error_and_no_log_line(status, log_lines):
    async def main():
        async with loopback_http(echoing_gateway(status)) as url:
            settings = ExplicitSettings.load(
                profile="sqld", url=url, auth_token=TOKEN, retry_attempts=3, retry_initial_delay=0.001
            )
            executor = HranaExecutor(settings)
            try:
                return await retry.acall_with_retry(settings, "publish", lambda: executor.execute(Stmt("SELECT 1")))
            finally:
                await executor.aclose()

    with pytest.raises(Exception) as raised:  # noqa: PT011 - the kind depends on the status
        asyncio.run(main())
    text = str(raised.value)
    assert TOKEN not in text and "eyJ" not in text, text
    assert MARK in text, "the echo is still there to read, the token replaced"
    logged = log_lines.getvalue()
    if status in (502, 500, 429):
        assert isinstance(raised.value, PrimaryUnavailableError)
        assert '"retrying"' in logged, "the transient answers were retried and logged"
    assert TOKEN not in logged, logged


def test_every_log_line_is_scrubbed_the_standard_librarys_and_its_tracebacks_included(log_lines):
    ExplicitSettings.load(profile="sqld", url="http://127.0.0.1:9", auth_token=TOKEN)
    try:
        raise RuntimeError(f"the primary said: token {TOKEN} is expired")
    except RuntimeError:
        logging.getLogger("harel.worker").exception("handling failed")
    structlog.get_logger("harel_edge.test").warning("sync failed", error=f"Authorization: Bearer {TOKEN}", nested={"why": [TOKEN]})
    logged = log_lines.getvalue()
    assert TOKEN not in logged, logged
    assert len([json.loads(line) for line in logged.splitlines()]) == 2


@pytest.mark.parametrize(
    "text",
    [
        "authorization: Bearer abc.def-ghi",
        '{"Authorization": "Bearer abc.def-ghi"}',
        "AUTHORIZATION=bearer abc.def-ghi",
        "authorization: Basic dXNlcjpwYXNz",
        "token eyJhbGciOiJFZERTQSJ9.eyJhIjoicncifQ.sig-nature was refused",
    ],
)
def test_a_bearer_value_or_an_authorization_header_is_scrubbed_even_when_no_setting_knows_the_token(text):
    scrubbed = scrub(text)
    assert MARK in scrubbed
    for secret in ("abc.def-ghi", "dXNlcjpwYXNz", "sig-nature"):
        assert secret not in scrubbed, scrubbed


def test_scrubbing_leaves_a_text_without_secrets_as_it_is():
    text = "the primary at http://127.0.0.1:8080 answered HTTP 502 (bad gateway); retried under the retry policy"
    assert scrub(text) == text
