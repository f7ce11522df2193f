"""Bridges engine output channels (filled by the engine thread) into an asyncio consumer."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor

from adapters.http.doorbell import Doorbell
from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd
from domain.requests.engine_request import CheckedRequest, EngineRequest
from ports.engine_client import EngineClient

# Threads that wait on checks which may compile a grammar (each at most the compile budget),
# and on submits to an engine in another process; the compiler bounds the compiles themselves.
_CHECK_THREADS = 32


@functools.cache
def _check_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_CHECK_THREADS, thread_name_prefix="request-check")


async def check_all(client: EngineClient, requests: list[EngineRequest]) -> list[CheckedRequest]:
    """Checks requests in order (the first refusal raises); a check that may compile a grammar
    runs on a thread, so the event loop keeps serving other streams meanwhile."""
    if all(request.grammar is None for request in requests):
        return [client.check(request) for request in requests]
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _check_pool(), lambda: [client.check(request) for request in requests]
    )


class RequestGroup:
    """The engine requests of one HTTP request (one per prompt), read as one async stream.

    All requests are checked before the group is built (`checked`: a 400 before any response
    starts), and submitted together, so a bad prompt admits nothing. Leaving the iteration early
    (a closed connection, an error) aborts every request that has not ended.
    """

    def __init__(
        self, client: EngineClient, checked: list[CheckedRequest], capacity: int = 64
    ) -> None:
        self._checked = checked
        self._client = client
        self._requests = [item.request for item in checked]
        self._capacity = capacity
        self._ended: set[int] = set()

    @classmethod
    async def checked(
        cls, client: EngineClient, requests: list[EngineRequest], capacity: int = 64
    ) -> RequestGroup:
        """Checks the requests off the event loop (`check_all`) and groups them."""
        return cls(client, await check_all(client, requests), capacity)

    async def items(self) -> AsyncIterator[tuple[int, ChoiceDelta | PromptScores | RequestEnd]]:
        """Yields (prompt index, item) until every request has ended."""
        ready = asyncio.Event()
        doorbell = Doorbell.of(asyncio.get_running_loop())

        def wake() -> None:
            doorbell.ring(ready)  # on the engine thread

        channels = [OutputChannel(self._capacity, on_ready=wake) for _ in self._requests]
        submitted: list[str] = []
        try:
            await self._submit(list(zip(self._checked, channels, strict=True)))
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

    async def _submit(self, submissions: list[tuple[CheckedRequest, OutputChannel]]) -> None:
        """Submits at once, or on a thread where the submit waits for another process's answer
        (the event loop keeps serving other streams meanwhile)."""
        if not self._client.submit_waits:
            self._client.submit_all(submissions)
            return
        pending = _check_pool().submit(self._client.submit_all, submissions)
        try:
            await asyncio.wrap_future(pending)
        except asyncio.CancelledError:
            # The caller left while the submit travelled; whatever it admitted ends at once.
            pending.add_done_callback(self._abort_if_admitted)
            raise

    def _abort_if_admitted(self, submitted: Future[None]) -> None:
        if not submitted.cancelled() and submitted.exception() is None:
            for request in self._requests:
                self._client.abort(request.request_id)
