"""An HTTP server on loopback, in the caller's event loop, for tests that put something of their
own in front of the primary (a gateway that echoes headers, a relay that holds requests back)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def loopback_http(handler: Handler) -> AsyncIterator[str]:
    """Serve every request with `handler` on 127.0.0.1 (a free port); yields the server's URL."""
    runner = web.ServerRunner(web.Server(handler), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
