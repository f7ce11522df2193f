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
        # A server's loop keeps running after a client leaves; give it a moment to finalize the
        # abandoned response generator before this test loop closes.
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
