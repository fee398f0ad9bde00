"""A relay on loopback between Hrana clients and a real sqld that fails chosen requests.

It is a real HTTP server (its own event loop on a thread), so every face reaches the primary
through it the same way a user's does: the async core, the sync faces and the CLI in a
subprocess are all pointed at `relay.url` instead of the server's. `arm(fault, when=...)` fails
the next request whose body contains `when`: before sqld sees it, or after sqld applied it
and before its answer comes back (the ambiguous case).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass

import httpx

LOOPBACK = "127.0.0.1"

# sqld applied the request; its answer is lost on the way back.
AMBIGUOUS = ("500 after", "garbage after", "truncated after", "closed after")
# sqld never saw the request ("write lock held": answered as sqld answers a batch whose BEGIN met
# its WAL checkpoint, which refuses writers at once: SQLITE_BUSY on the first step, no other run).
REFUSED = ("500 before", "stream expired", "write lock held")
FAULTS = AMBIGUOUS + REFUSED


@dataclass
class _Armed:
    fault: str
    when: bytes | None


class FaultyRelay:
    """Forwards every request to `upstream` (sqld's HTTP address) and answers with sqld's
    answer, except for the requests armed to fail. A context manager."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []
        self.fired: list[str] = []  # the faults that were applied, in order
        self.applied = 0  # requests sqld answered
        self.transactions = 0  # of which carried a transaction (a batch)
        self.batches = 0  # the transactions (batches) in the requests sqld answered
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault relay did not start within 10 s")
        self.url = f"http://{LOOPBACK}:{self.port}"

    # ---- what a test calls ---------------------------------------------------------------------

    def arm(self, fault: str, when: str | bytes | None = None) -> None:
        """Fail the next request whose body contains `when` (any request when None) with `fault`."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        needle = when.encode() if isinstance(when, str) else when
        with self._lock:
            self._armed.append(_Armed(fault, needle))

    @property
    def armed(self) -> list[str]:
        """The faults armed and not yet applied."""
        with self._lock:
            return [a.fault for a in self._armed]

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FaultyRelay:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- the relay -----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(base_url=self.upstream, timeout=30.0)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, LOOPBACK, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            connections = asyncio.all_tasks(self._loop)
            for task in connections:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*connections, return_exceptions=True))
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

    def _take(self, body: bytes) -> str | None:
        with self._lock:
            for i, armed in enumerate(self._armed):
                if armed.when is None or armed.when in body:
                    del self._armed[i]
                    self.fired.append(armed.fault)
                    return armed.fault
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another on this connection
                request = await _read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                if not await self._answer(writer, method, path, headers, body):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # a client gone, or the relay closing (a cancelled one would be logged as an error)
        finally:
            writer.transport.abort()

    async def _answer(self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict, body: bytes) -> bool:
        """Answer one request; False when the connection was dropped on purpose."""
        fault = self._take(body)
        if fault == "500 before":
            return await _respond(writer, 500, b"internal error")
        if fault == "stream expired":
            requests = json.loads(body)["requests"]
            error = {"type": "error", "error": {"message": "stream expired", "code": "STREAM_EXPIRED"}}
            return await _respond(writer, 200, json.dumps({"baton": None, "results": [error] * len(requests)}).encode())
        if fault == "write lock held":
            return await _respond(writer, 200, json.dumps(_lock_refused(json.loads(body)["requests"])).encode())
        forwarded = {k: v for k, v in headers.items() if k in ("authorization", "content-type")}
        answer = await self._client.request(method, path, content=body, headers=forwarded)
        self.applied += 1
        self.transactions += b'"type":"batch"' in body.replace(b" ", b"")
        self.batches += body.replace(b" ", b"").count(b'"type":"batch"')
        if fault == "500 after":
            return await _respond(writer, 500, b"internal error")
        if fault == "garbage after":
            return await _respond(writer, 200, b'{"results": [{"type": "ok", "resp')
        if fault == "truncated after":
            # The whole length announced, half the body sent, then the connection closed.
            head = _head(answer.status_code, len(answer.content))
            writer.write(head + answer.content[: len(answer.content) // 2])
            await writer.drain()
            return False
        if fault == "closed after":
            return False  # closed without a word
        return await _respond(writer, answer.status_code, answer.content)


def _lock_refused(requests: list[dict]) -> dict:
    """sqld's answer to a pipeline that met the write lock: a batch's first step (BEGIN IMMEDIATE)
    failed and every later step's condition kept it from running; a statement alone failed."""
    busy = {"message": "SQLite error: database is locked", "code": "SQLITE_BUSY"}
    results = []
    for request in requests:
        if request["type"] == "batch":
            steps = len(request["batch"]["steps"])
            result = {"step_results": [None] * steps, "step_errors": [busy] + [None] * (steps - 1)}
            results.append({"type": "ok", "response": {"type": "batch", "result": result}})
        elif request["type"] == "execute":  # a statement alone meets the checkpoint as sqld answers it
            results.append({"type": "error", "error": busy})
        else:
            results.append({"type": "ok", "response": {"type": request["type"]}})
    return {"baton": None, "results": results}


def _head(status: int, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes) -> bool:
    writer.write(_head(status, len(body)) + body)
    await writer.drain()
    return True


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, headers, body
