"""The engine process's side of the socket: one session per API process, over one engine."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener

from adapters.engine_ipc import messages as m
from adapters.engine_ipc.outputs_codec import Output, encode_outputs
from adapters.engine_ipc.ready_queue import ReadyQueue
from domain.emission.channel import OutputChannel
from domain.emission.outputs import RequestEnd
from domain.requests.engine_request import CheckedRequest, EngineRequest
from ports.engine_client import EngineClient
from ports.response_store import ResponseStorage

_log = logging.getLogger(__name__)
# Threads that compile grammars for checks, across all sessions (the compiler bounds the
# compiles themselves); a session's reader never waits on one.
_CHECK_THREADS = 32
# Checked requests a session keeps for the submit that follows: a group whose later prompt
# failed its check never submits the earlier ones, so the oldest are let go (a submit that
# finds its request gone checks it again).
_PENDING_CHECKS = 1024


@dataclass(frozen=True)
class _Shared:
    """What every session of one server uses: the engine, the greeting, the Responses store,
    why the model can no longer run, the channels' capacity and the grammar-check threads."""

    engine: EngineClient
    hello: m.Hello
    store: ResponseStorage
    failure: Callable[[], str | None]
    capacity: int
    checks: ThreadPoolExecutor


class EngineServer:
    """Listens on a unix socket; every API process that proves `authkey` gets a session.

    The sessions share `engine`, `store` and `failure` (why the model can no longer run).
    """

    def __init__(
        self,
        engine: EngineClient,
        hello: m.Hello,
        store: ResponseStorage,
        address: str,
        authkey: bytes,
        *,
        failure: Callable[[], str | None] = lambda: None,
        channel_capacity: int = 64,
    ) -> None:
        checks = ThreadPoolExecutor(_CHECK_THREADS, thread_name_prefix="engine-check")
        self._shared = _Shared(engine, hello, store, failure, channel_capacity, checks)
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        self._sessions: set[_Session] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="engine-accept", daemon=True)

    @property
    def address(self) -> str:
        return str(self._listener.address)

    @property
    def session_count(self) -> int:
        """API processes connected now."""
        with self._lock:
            return len(self._sessions)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stops accepting and drops every session (their requests are aborted)."""
        with self._lock:
            self._closed, sessions = True, list(self._sessions)
        self._listener.close()
        for session in sessions:
            session.close()
        self._shared.checks.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except OSError:  # the listener closed
                return
            except Exception as error:  # noqa: BLE001 - a peer without the key, say
                _log.warning("refused a connection to the engine: %s", error)
                continue
            session = _Session(connection, self._shared, self._ended)
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._sessions.add(session)
            session.start()

    def _ended(self, session: _Session) -> None:
        with self._lock:
            self._sessions.discard(session)


class _Session:
    """One API process: a reader that handles its messages in order, and a writer that sends
    the outputs of its requests in batches.

    The engine thread only marks a request's channel ready; the writer drains channels, so a
    slow API process makes its channels merge deltas (bounded), never the engine wait.
    """

    def __init__(
        self, connection: Connection, shared: _Shared, on_end: Callable[[_Session], None]
    ) -> None:
        self._connection = connection
        self._shared = shared
        self._on_end = on_end
        self._engine = shared.engine
        self._send_lock = threading.Lock()
        self._state = threading.Condition()
        self._live: dict[str, OutputChannel] = {}
        self._ready = ReadyQueue(self._state)  # request IDs with items to send, in order
        self._closed = False
        self._pending: OrderedDict[str, CheckedRequest] = OrderedDict()
        self._reader = threading.Thread(target=self._read, name="engine-session", daemon=True)
        self._writer = threading.Thread(target=self._write, name="engine-outputs", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def close(self) -> None:
        with self._send_lock:  # the reader closes the descriptor under this lock
            m.hang_up(self._connection)

    def _send(self, *message: object) -> None:
        with self._send_lock:
            self._connection.send(message)

    def _read(self) -> None:
        try:
            self._send(m.HELLO, self._shared.hello)
            while True:
                self._handle(self._connection.recv())
        except (EOFError, OSError):
            pass
        finally:
            self._leave()

    def _leave(self) -> None:
        """The API process is gone: its requests are aborted, nobody else's."""
        with self._state:
            self._closed = True
            orphans = list(self._live)
            self._state.notify_all()
        for request_id in orphans:
            self._engine.abort(request_id)
        if orphans:
            _log.warning("an API process left; aborted its %d requests", len(orphans))
        with self._send_lock:  # no send may write to the descriptor once it is closed
            self._connection.close()
        self._on_end(self)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == m.ABORT:
            self._engine.abort(message[1])
            return
        call = message[1]
        try:
            if kind == m.CHECK:
                self._shared.checks.submit(self._check, call, message[2])
                return
            value: object = None
            if kind == m.SUBMIT:
                self._submit(message[2])
            elif kind == m.STORE_GET:
                value = self._shared.store.get(message[2])
            elif kind == m.STORE_PUT:
                self._shared.store.put(message[2], message[3])
            elif kind == m.HEALTH:
                value = self._shared.failure()
            else:
                raise ValueError(f"unknown message {kind!r}")
        except Exception as error:  # noqa: BLE001 - the caller's request fails, the session goes on
            self._send(m.FAILED, call, m.WireError.of(error))
            return
        self._send(m.REPLY, call, value)

    def _check(self, call: int, request: EngineRequest) -> None:
        try:
            checked = self._engine.check(request)
        except Exception as error:  # noqa: BLE001 - sent back as the check's refusal
            self._reply(m.FAILED, call, m.WireError.of(error))
            return
        with self._state:
            self._pending[request.request_id] = checked
            while len(self._pending) > _PENDING_CHECKS:
                self._pending.popitem(last=False)
        self._reply(m.REPLY, call, None)

    def _reply(self, *message: object) -> None:
        """From a check thread: a session that has gone needs no answer."""
        with contextlib.suppress(OSError):
            self._send(*message)

    def _submit(self, requests: list[EngineRequest]) -> None:
        checked = [self._checked(request) for request in requests]
        channels = [
            OutputChannel(
                self._shared.capacity, on_ready=functools.partial(self._mark, request.request_id)
            )
            for request in requests
        ]
        with m.routed(self._live, self._state, requests, channels):
            self._engine.submit_all(list(zip(checked, channels, strict=True)))

    def _checked(self, request: EngineRequest) -> CheckedRequest:
        """The check made for this request (one with a grammar), else a fresh one."""
        with self._state:
            pending = self._pending.pop(request.request_id, None)
        if pending is not None and pending.request == request:
            return pending
        return self._engine.check(request)

    def _mark(self, request_id: str) -> None:
        """Runs on the engine thread, once a step for each channel the step delivered to
        (`ReadyRings`): queues it for the writer, which it wakes if asleep (`ReadyQueue`)."""
        self._ready.put(request_id)

    def _write(self) -> None:
        while True:
            with self._state:
                self._ready.wait(lambda: self._closed)
                if self._closed:
                    return
                channels = [(rid, self._live.get(rid)) for rid in self._ready.drain()]
            batch: list[tuple[str, Output]] = []
            for request_id, channel in channels:
                if channel is None:
                    continue
                while (item := channel.get_nowait()) is not None:
                    batch.append((request_id, item))
                    if isinstance(item, RequestEnd):
                        with self._state:
                            self._live.pop(request_id, None)
            if not batch:
                continue
            try:
                self._send(m.OUTPUTS, encode_outputs(batch))
            except OSError:
                return
