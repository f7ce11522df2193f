"""A submit that waits on another process's answer leaves the event loop serving others."""

from __future__ import annotations

import asyncio
import threading

from adapters.http.engine_bridge import RequestGroup
from domain.emission.outputs import RequestEnd, Usage
from domain.requests.engine_request import CheckedRequest, EngineRequest
from domain.requests.sampling import SamplingParams

WAIT_S = 5.0


class _Client:
    """Holds each submit until released, as an engine in another process answers later."""

    max_model_len = 64

    def __init__(self, submit_waits: bool) -> None:
        self.submit_waits = submit_waits
        self.release = threading.Event()
        self.started = threading.Event()
        self.submitted_on: list[int] = []
        self.aborted: list[str] = []

    def check(self, request: EngineRequest) -> CheckedRequest:
        return CheckedRequest(request, self)

    def submit_all(self, submissions) -> None:
        self.submitted_on.append(threading.get_ident())
        self.started.set()
        if self.submit_waits and not self.release.wait(WAIT_S):
            raise TimeoutError("the test never released the submit")
        for _, channel in submissions:
            channel.put(RequestEnd(Usage(3, 0)))

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _group(client: _Client) -> RequestGroup:
    params = SamplingParams(max_tokens=1)
    requests = [EngineRequest(f"r{i}", (1, 2, 3), params) for i in range(2)]
    return RequestGroup(client, [client.check(request) for request in requests])


async def _consume(group: RequestGroup) -> list[object]:
    return [item async for _, item in group.items()]


def test_the_loop_keeps_turning_while_a_submit_waits_for_the_engine_process():
    async def scenario() -> tuple[int, list[object]]:
        client = _Client(submit_waits=True)
        consuming = asyncio.create_task(_consume(_group(client)))
        turns = 0
        while not client.started.is_set() or turns < 20:
            await asyncio.sleep(0.005)
            turns += 1
        assert not consuming.done()
        client.release.set()
        return turns, await asyncio.wait_for(consuming, WAIT_S)

    turns, items = asyncio.run(scenario())

    assert turns >= 20
    assert [type(item) for item in items] == [RequestEnd, RequestEnd]


def test_a_caller_that_leaves_during_the_submit_has_what_it_admitted_aborted():
    async def scenario() -> _Client:
        client = _Client(submit_waits=True)
        consuming = asyncio.create_task(_consume(_group(client)))
        while not client.started.is_set():
            await asyncio.sleep(0.005)
        consuming.cancel()
        client.release.set()
        for _ in range(400):
            if client.aborted:
                break
            await asyncio.sleep(0.005)
        return client

    client = asyncio.run(scenario())

    assert client.aborted == ["r0", "r1"]


def test_an_engine_in_this_process_is_submitted_to_on_the_loop_itself():
    async def scenario() -> tuple[_Client, int, list[object]]:
        client = _Client(submit_waits=False)
        return client, threading.get_ident(), await _consume(_group(client))

    client, loop_thread, items = asyncio.run(scenario())

    assert client.submitted_on == [loop_thread]
    assert len(items) == 2
