"""Bridges engine output channels (filled by the engine thread) into an asyncio consumer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from domain.channel import OutputChannel
from domain.engine_request import EngineRequest
from domain.outputs import ChoiceDelta, PromptScores, RequestEnd
from ports.engine_client import EngineClient


class RequestGroup:
    """The engine requests of one HTTP request (one per prompt), read as one async stream.

    All requests are checked when the group is built (a 400 before any response starts), and
    submitted together, so a bad prompt admits nothing. Leaving the iteration early (a closed
    connection, an error) aborts every request that has not ended.
    """

    def __init__(
        self, client: EngineClient, requests: list[EngineRequest], capacity: int = 64
    ) -> None:
        self._checked = [client.check(request) for request in requests]
        self._client = client
        self._requests = requests
        self._capacity = capacity
        self._ended: set[int] = set()

    async def items(self) -> AsyncIterator[tuple[int, ChoiceDelta | PromptScores | RequestEnd]]:
        """Yields (prompt index, item) until every request has ended."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:
            # Runs on the engine thread; a consumer whose loop has closed is simply gone.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(ready.set)

        channels = [OutputChannel(self._capacity, on_ready=wake) for _ in self._requests]
        submitted: list[str] = []
        try:
            self._client.submit_all(list(zip(self._checked, channels, strict=True)))
            submitted = [request.request_id for request in self._requests]
            while len(self._ended) < len(channels):
                ready.clear()
                drained = False
                for index, channel in enumerate(channels):
                    while index not in self._ended and (item := channel.get_nowait()) is not None:
                        drained = True
                        if isinstance(item, RequestEnd):
                            self._ended.add(index)
                        yield index, item
                if not drained:
                    await ready.wait()
        finally:
            for index, request_id in enumerate(submitted):
                if index not in self._ended:
                    self._client.abort(request_id)
