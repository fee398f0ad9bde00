"""The HTTP side of a primary (sqld or Turso): its address, the connection pool opened on the loop
that uses it, and one Hrana exchange sent and its answer read, with what each failure means to
the retry policy. `HranaExecutor` coalesces units into these exchanges."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
import structlog

from harel_edge.errors import AuthError, PrimaryUnavailableError
from harel_edge.executor.hrana import STREAM_PIPELINE
from harel_edge.redaction import scrub
from harel_edge.settings import EdgeSettings

if TYPE_CHECKING:
    from harel_edge.executor.stream import HranaSession

log = structlog.get_logger("harel_edge.executor.remote")

JSON_BODY = {"Content-Type": "application/json"}  # the body is encoded here (orjson), not by aiohttp
# A pipeline of many commits is still small (a few KB a unit); sqld answers it in milliseconds.
# `sock_read` bounds how long a unit may wait for an answer that never comes; `connect` includes
# the wait for a free connection of the pool, `sock_connect` the TCP (and TLS) handshake alone.
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30.0, sock_connect=5.0, sock_read=30.0)


def http_base_url(url: str) -> str:
    """The HTTP address of a primary: `libsql://` is Turso's HTTPS (the settings refuse `ws://`)."""
    parts = urlsplit(url)
    scheme = {"libsql": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http://, https:// or libsql:// address")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def environment_proxy(url: str) -> str | None:
    """The proxy that HTTP_PROXY / HTTPS_PROXY / NO_PROXY name for `url`, if any."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class PrimaryHttp:
    """One primary's address, token and connection pool (`pool` connections); `exchanges` counts
    what was sent, for benchmarks and tests."""

    def __init__(self, settings: EdgeSettings, *, pool: int) -> None:
        server = settings.server
        if not server:
            raise ValueError(f"the {settings.profile} profile has no primary to send statements to")
        self.where = server
        token = settings.auth_token.get_secret_value().strip() if settings.auth_token else ""
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._headers.update(settings.database_header)
        self._base_url = http_base_url(server)
        self._proxy = environment_proxy(self._base_url)
        self._pool = pool
        self._client: aiohttp.ClientSession | None = None  # opened on the loop, at the first exchange
        self.exchanges = 0

    def __repr__(self) -> str:  # never the token
        return f"<PrimaryHttp {self.where}>"

    @property
    def closed(self) -> bool:
        return self._client is not None and self._client.closed

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, opened on the loop that uses it. The environment's proxy is looked
        up once, here, not at every request (aiohttp's `trust_env` does it in a thread each time)."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                headers=self._headers,
                timeout=TIMEOUT,
                connector=aiohttp.TCPConnector(limit=self._pool),
            )
        return self._client

    async def post(self, requests: list[dict[str, Any]], *, stream: HranaSession | None = None) -> list[dict[str, Any]]:
        """One HTTP exchange; raises what a caller's retry policy can classify. Without a
        `stream` the exchange opens a stream and closes it (no stream is left to expire after a
        worker dies, nor holds one of the primary's connections); with one, it goes on that stream."""
        return await self.send(self.encode([orjson.dumps(r) for r in requests], stream), stream)

    def encode(self, requests: list[bytes], stream: HranaSession | None) -> _Body:
        """The exchange's body from its requests' JSON (orjson: a tenth of the json module's time).
        Only bytes stay while the exchange is on the wire: a grouped batch's dicts took about
        four times the memory of its JSON."""
        count = len(requests)
        if stream is None:
            url, baton, requests = STREAM_PIPELINE, b"null", [*requests, b'{"type":"close"}']
        else:
            url, baton = stream.url, orjson.dumps(stream.baton)
        target = url if url.startswith(("http://", "https://")) else self._base_url + url
        data = b'{"baton":' + baton + b',"requests":[' + b",".join(requests) + b"]}"
        return _Body(target, data, count)

    async def send(self, body: _Body, stream: HranaSession | None = None) -> list[dict[str, Any]]:
        """Send an encoded exchange (`encode`) and read its answer's results."""
        self.exchanges += 1
        try:
            async with self._http().post(body.url, data=body.data, headers=JSON_BODY, proxy=self._proxy) as response:
                status, content = response.status, await response.read()
        except TimeoutError as exc:
            raise PrimaryUnavailableError(
                f"the primary at {self.where} did not answer in time ({type(exc).__name__}); its "
                "outcome is unknown and is looked up before any retry"
            ) from None
        except aiohttp.ClientError as exc:
            raise PrimaryUnavailableError(
                f"cannot reach the primary at {self.where} ({type(exc).__name__}: {scrub(str(exc))}): check that it "
                "runs and that HAREL_EDGE_URL / HAREL_EDGE_SYNC_URL is its HTTP address"
            ) from None
        log.debug("hrana exchange", requests=body.requests, status=status)  # a line a request, when debugging
        if status != 200:
            raise _status_error(self.where, status, scrub(content.decode(errors="replace")))
        try:
            answer = orjson.loads(content)
            results = answer["results"]
            if not isinstance(results, list) or len(results) < body.requests:
                raise ValueError("fewer results than requests")
            if stream is not None:
                stream.follow(answer.get("baton"), answer.get("base_url"))
        except (ValueError, KeyError, TypeError) as exc:
            raise PrimaryUnavailableError(
                f"the primary at {self.where} sent an answer that is not Hrana ({exc}); its outcome "
                "is unknown and is looked up before any retry"
            ) from None
        return results[: body.requests]



@dataclass(frozen=True)
class _Body:
    url: str
    data: bytes = field(repr=False)  # the statements' arguments: an application's data
    requests: int  # how many results the answer must hold



def _status_error(where: str, status: int, text: str) -> Exception:
    """What an HTTP answer other than 200 means to the caller's retry policy."""
    if status in (401, 403):
        return AuthError(
            f"the primary at {where} refused the credentials (HTTP {status}: {text[:200]}): set "
            "HAREL_EDGE_AUTH_TOKEN to a valid read-write token"
        )
    if status >= 500 or status == 429:
        return PrimaryUnavailableError(f"the primary at {where} answered HTTP {status} ({text[:200]}); retried under the retry policy")
    return ValueError(f"the primary at {where} rejected the request: HTTP {status} {text[:300]}")
