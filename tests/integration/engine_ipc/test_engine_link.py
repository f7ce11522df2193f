"""The engine socket: a real engine (over the fake executor) behind an EngineServer, reached by
EngineLinks as API processes reach it, with the test stepping the engine itself."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Pipe
from pathlib import Path

import pytest

from adapters.engine_ipc import messages as m
from adapters.engine_ipc.client import EngineLink, RemoteEngine, RemoteResponseStore
from adapters.engine_ipc.server import EngineServer
from domain.common.errors import (
    InvalidRequestError,
    OverloadedError,
    RequestFailedError,
    UnhealthyError,
)
from domain.emission.channel import OutputChannel
from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import CheckedRequest, EngineRequest
from domain.requests.sampling import SamplingParams
from domain.responses.store import ResponseStore, StoredResponse
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import FakeExecutor, FakeGrammarCompiler, FakeTokenizer, RecordingObserver
from tests.support.draining import step_until_idle
from tests.support.geometry import fake_geometry

AUTHKEY = b"a key the test and the server share"
WAIT_S = 10.0


@dataclass
class World:
    """An engine nobody steps but the test, served on a socket."""

    engine: Engine
    server: EngineServer
    observer: RecordingObserver
    grammars: FakeGrammarCompiler
    address: str

    def link(self) -> EngineLink:
        return EngineLink.connect(self.address, AUTHKEY, WAIT_S)


def build_engine(max_waiting: int = 1024) -> tuple[Engine, RecordingObserver, FakeGrammarCompiler]:
    observer = RecordingObserver()
    grammars = FakeGrammarCompiler()
    executor = FakeExecutor(fake_geometry(), grammars=grammars)
    config = EngineConfig(max_num_batched_tokens=32, max_waiting=max_waiting)
    engine = Engine(executor, FakeTokenizer(), config, observer=observer, grammars=grammars)
    return engine, observer, grammars


@pytest.fixture
def make_world() -> Iterator[Callable[..., World]]:
    # A short directory: a unix socket's path has room for about a hundred bytes.
    directory = Path(tempfile.mkdtemp(prefix="ipc-"))
    servers: list[EngineServer] = []

    def make(max_waiting: int = 1024) -> World:
        engine, observer, grammars = build_engine(max_waiting)
        hello = m.Hello("fake", "unused", engine.max_model_len, engine.logprob_limits, 1)
        address = str(directory / f"engine{len(servers)}.sock")
        server = EngineServer(engine, hello, ResponseStore(), address, AUTHKEY)
        server.start()
        servers.append(server)
        return World(engine, server, observer, grammars, address)

    yield make
    for server in servers:
        server.close()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    return make_world()


def request(request_id: str, max_tokens: int = 6, **fields: object) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(request_id, (3, 4, 5, 6), params, **fields)


def submit(client: RemoteEngine, *requests: EngineRequest) -> list[OutputChannel]:
    channels = [OutputChannel(8) for _ in requests]
    checked = [client.check(item) for item in requests]
    client.submit_all(list(zip(checked, channels, strict=True)))
    return channels


def drain(channel: OutputChannel) -> list[object]:
    """Every item up to the end, as it arrives over the socket."""
    items: list[object] = []
    deadline = time.monotonic() + WAIT_S
    while not items or not isinstance(items[-1], RequestEnd):
        assert time.monotonic() < deadline, f"no end after {items}"
        item = channel.get(timeout=0.05)
        if item is not None:
            items.append(item)
    return items


def joined(items: list[object]) -> tuple[tuple[int, ...], str | None, RequestEnd]:
    deltas = [item for item in items if isinstance(item, ChoiceDelta)]
    tokens = tuple(t for delta in deltas for t in delta.token_ids)
    return tokens, deltas[-1].finish_reason if deltas else None, items[-1]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_outputs_cross_the_socket_as_the_engine_emits_them(world: World) -> None:
    asked = request("r1", logprobs=LogprobAsk(wanted=True, count=2))
    local, _, _ = build_engine()
    expected = local.submit(asked)
    step_until_idle(local)
    link = world.link()
    client = RemoteEngine(link)

    (channel,) = submit(client, asked)
    step_until_idle(world.engine)
    items = drain(channel)

    assert items == list(expected)
    assert joined(items)[1] == "length"
    link.close()


def test_checks_refuse_before_admission_with_the_engines_own_messages(world: World) -> None:
    client = RemoteEngine(world.link())
    outside = EngineRequest("v", (3, 999), SamplingParams(max_tokens=2))
    bad_grammar = request("g", grammar=GrammarSpec(GrammarKind.CHOICE, '["Upper"]', "tools"))

    with pytest.raises(InvalidRequestError) as here:
        client.check(outside)
    with pytest.raises(InvalidRequestError) as there:
        world.engine.check(outside)
    with pytest.raises(InvalidRequestError) as compiled:
        client.check(bad_grammar)

    assert (here.value.message, here.value.param) == (there.value.message, there.value.param)
    assert compiled.value.param == "tools"
    assert not world.engine.has_work()


def test_a_request_with_a_grammar_compiles_as_often_as_in_one_process(world: World) -> None:
    """The engine process checks it and keeps the check for the submit: no second compile."""
    constrained = request("g", grammar=GrammarSpec(GrammarKind.CHOICE, '["yes", "no"]'))
    local, _, local_grammars = build_engine()
    local.submit(constrained)
    step_until_idle(local)
    client = RemoteEngine(world.link())

    (channel,) = submit(client, constrained)
    step_until_idle(world.engine)
    tokens, reason, end = joined(drain(channel))

    assert world.grammars.compiled == local_grammars.compiled
    assert end.error is None
    assert FakeTokenizer().decode(tokens) in {"yes", "no"}


def test_an_abort_crosses_to_the_engine(world: World) -> None:
    link = world.link()
    client = RemoteEngine(link)
    (channel,) = submit(client, request("gone", max_tokens=50))
    world.engine.step()

    client.abort("gone")
    RemoteResponseStore(link).get("nothing")  # replied after the abort, which came first
    step_until_idle(world.engine)

    assert joined(drain(channel))[1] == "abort"
    assert [f.reason for f in world.observer.observed("finished")] == ["abort"]


def test_an_api_process_that_goes_loses_its_own_requests_only(world: World) -> None:
    leaving, staying = world.link(), world.link()
    submit(RemoteEngine(leaving), request("left", max_tokens=50))
    (kept,) = submit(RemoteEngine(staying), request("kept", max_tokens=8))
    world.engine.step()

    leaving.close()
    wait_for(lambda: world.server.session_count == 1, "the server never saw the link go")
    step_until_idle(world.engine)

    assert joined(drain(kept))[1] == "length"
    reasons = sorted(f.reason for f in world.observer.observed("finished"))
    assert reasons == ["abort", "length"]


def test_a_full_admission_queue_refuses_the_whole_submission(
    make_world: Callable[..., World],
) -> None:
    world = make_world(max_waiting=1)
    client = RemoteEngine(world.link())

    with pytest.raises(OverloadedError):
        submit(client, request("a"), request("b"))
    (channel,) = submit(client, request("c"))
    step_until_idle(world.engine)

    assert joined(drain(channel))[1] == "length"


def test_when_the_engine_goes_its_requests_end_with_an_error_and_calls_fail_at_once(
    world: World,
) -> None:
    link = world.link()
    client = RemoteEngine(link)
    (channel,) = submit(client, request("running", max_tokens=50))

    world.server.close()
    end = drain(channel)[-1]

    assert end.error is not None
    assert client.failure() is not None
    with pytest.raises(UnhealthyError) as refused:
        submit(client, request("later"))
    assert refused.value.status == 503


def test_the_response_store_is_one_for_every_link(world: World) -> None:
    first, second = RemoteResponseStore(world.link()), RemoteResponseStore(world.link())
    stored = StoredResponse.of(b'{"id": "resp_1"}', [{"role": "user", "content": "hi"}])

    first.put("resp_1", stored)

    assert second.get("resp_1") == stored
    assert second.get("resp_2") is None


def test_only_requests_checked_by_the_client_are_submitted_through_it(world: World) -> None:
    client = RemoteEngine(world.link())
    foreign = CheckedRequest(request("x"), issuer=object())

    with pytest.raises(ValueError, match="checked"):
        client.submit_all([(foreign, OutputChannel(8))])


def test_a_peer_without_the_key_is_refused_and_the_server_serves_on(world: World) -> None:
    with pytest.raises(AuthenticationError):
        Client(world.address, family="AF_UNIX", authkey=b"wrong")

    assert RemoteResponseStore(world.link()).get("anything") is None


def test_errors_cross_as_values_and_come_back_as_their_domain_error() -> None:
    sending, receiving = Pipe()
    sending.send((m.FAILED, 7, m.WireError.of(InvalidRequestError("bad n", param="n"))))
    sending.send((m.FAILED, 8, m.WireError.of(KeyError("boom"))))

    (_, call, first), (_, _, second) = receiving.recv(), receiving.recv()

    assert call == 7
    error = first.error()
    assert (type(error), error.message, error.param) == (InvalidRequestError, "bad n", "n")
    assert type(second.error()) is RequestFailedError
    assert second.error().status == 500
