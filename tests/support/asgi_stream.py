"""Reads a streamed ASGI response in-process, as a client that stays connected would.

Falcon's TestClient disconnects as soon as the first body chunk arrives (it simulates a client that
leaves), so whole event streams are read through an ASGI conductor instead.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from falcon import testing
from falcon.testing.client import _AsyncContextManager


async def _read(
    app: Any,
    method: str,
    path: str,
    until: bytes,
    timeout: float,
    max_chunks: int | None,
    kwargs: dict,
) -> tuple[int, bytes]:
    async with testing.ASGIConductor(app) as conductor:
        request = conductor.simulate_request(method, path, _stream_result=True, **kwargs)
        async with _AsyncContextManager(request) as result:
            body, chunks = b"", 0
            deadline = time.monotonic() + timeout
            while until not in body and time.monotonic() < deadline:
                if max_chunks is not None and chunks >= max_chunks:
                    break
                chunk = await result.stream.read()
                if chunk:
                    body += chunk
                    chunks += 1
                else:
                    await asyncio.sleep(0.005)
        if until not in body:
            # A server's loop keeps running after a client leaves; give it a moment to finalize
            # the abandoned response generator before this test loop closes. A client that read
            # to `until` (every caller's is its stream's last frame) abandoned nothing.
            await asyncio.sleep(0.2)
        return result.status_code, body


def stream_post(
    app: Any,
    path: str,
    *,
    json: dict,
    until: bytes = b"data: [DONE]",
    timeout: float = 30.0,
    max_chunks: int | None = None,
) -> tuple[int, str]:
    """POSTs and reads the response until `until` appears, `max_chunks` arrive, or time runs out;
    leaving then disconnects the simulated client."""
    status, body = asyncio.run(_read(app, "POST", path, until, timeout, max_chunks, {"json": json}))
    return status, body.decode()


async def _leave_after(app: Any, path: str, body: dict, marker: bytes) -> bytes:
    """Sends the request, then disconnects as soon as `marker` has arrived: the server sees the
    disconnect before it pulls its next event, as with a client that closes the connection."""
    import json as json_module

    payload = json_module.dumps(body).encode()
    scope = testing.create_scope(
        path=path,
        method="POST",
        headers={"content-type": "application/json"},
        content_length=len(payload),
    )
    left = asyncio.Event()
    requested = False
    received = b""

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal received
        received += message.get("body", b"") if message["type"] == "http.response.body" else b""
        if marker in received and not left.is_set():
            left.set()
            # Let the server's disconnect watcher see it before the next event is pulled.
            for _ in range(3):
                await asyncio.sleep(0)

    await asyncio.wait_for(app(scope, receive, send), timeout=30.0)
    return received


def post_and_leave(app: Any, path: str, *, json: dict, marker: bytes) -> str:
    """POSTs a streaming request and leaves right after the body holding `marker` arrives."""
    return asyncio.run(_leave_after(app, path, json, marker)).decode()


async def chunk_times(
    conductor: testing.ASGIConductor,
    path: str,
    *,
    json: dict,
    timeout: float = 30.0,
    arrived: asyncio.Event | None = None,
) -> list[float]:
    """POSTs on an open conductor and reads the whole stream; the monotonic time each body
    chunk arrived (other requests on the conductor's loop go on meanwhile). `arrived` is set
    at each chunk."""
    request = conductor.simulate_request("POST", path, _stream_result=True, json=json)
    times: list[float] = []
    async with _AsyncContextManager(request) as result:
        body = b""
        deadline = time.monotonic() + timeout
        while b"data: [DONE]" not in body and time.monotonic() < deadline:
            chunk = await result.stream.read()
            if chunk:
                times.append(time.monotonic())
                body += chunk
                if arrived is not None:
                    arrived.set()
            else:
                await asyncio.sleep(0.002)
    return times


async def read_stream(
    app: Any,
    path: str,
    *,
    json: dict,
    until: bytes = b"data: [DONE]",
    timeout: float = 30.0,
    max_chunks: int | None = None,
) -> tuple[int, str]:
    """`stream_post` inside a running loop, for tests that hold several streams at once."""
    status, body = await _read(app, "POST", path, until, timeout, max_chunks, {"json": json})
    return status, body.decode()


async def post(app: Any, path: str, *, json: dict) -> tuple[int, Any]:
    """A whole (non-streamed) POST inside a running loop: its status and JSON body."""
    async with testing.ASGIConductor(app) as conductor:
        result = await conductor.simulate_post(path, json=json)
        return result.status_code, result.json
