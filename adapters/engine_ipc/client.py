"""An API process's side of the socket: the engine client and response store over one link."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from multiprocessing.connection import Client, Connection

from adapters.engine_ipc import messages as m
from adapters.engine_ipc.outputs_codec import Output, decode_outputs
from domain.common.errors import DomainError, UnavailableError, UnhealthyError
from domain.emission.channel import OutputChannel
from domain.emission.outputs import RequestEnd, Usage
from domain.requests.engine_request import CheckedRequest, EngineRequest
from domain.responses.store import StoredResponse

_log = logging.getLogger(__name__)
_RETRY_S = 0.1


class _Call:
    """One call waiting for its reply."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: DomainError | None = None


class EngineLink:
    """The connection of one API process to the engine process.

    A reader thread routes the outputs that arrive to the channels of this process's requests
    and the replies to the calls that wait for them. When the engine process goes, every
    channel ends with an error, every waiting call fails and later calls fail at once (503).
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        kind, hello = connection.recv()
        if kind != m.HELLO:
            raise ConnectionError(f"the engine process opened with {kind!r}, not a greeting")
        self.hello: m.Hello = hello
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._channels: dict[str, OutputChannel] = {}
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._failure: str | None = None
        self._reader = threading.Thread(target=self._read, name="engine-link", daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, address: str, authkey: bytes, timeout_s: float) -> EngineLink:
        """Waits up to `timeout_s` for the engine process to listen (it does once its model
        has loaded), then connects."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(Client(address, family="AF_UNIX", authkey=authkey))
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_S)

    @property
    def failure(self) -> str | None:
        """Why the engine can no longer be reached, or None while it can."""
        return self._failure

    def close(self) -> None:
        with self._send_lock:  # the reader closes the descriptor under this lock
            m.hang_up(self._connection)

    def call(self, kind: str, *fields: object, timeout_s: float = m.CALL_TIMEOUT_S) -> object:
        """Sends a call and waits for its reply; a refusal raises the engine's domain error."""
        call = _Call()
        with self._lock:
            self._raise_if_gone()
            number = next(self._ids)
            self._calls[number] = call
        self._send(kind, number, *fields)
        if not call.done.wait(timeout_s):
            with self._lock:
                self._calls.pop(number, None)
            raise UnavailableError(f"the engine process did not answer within {timeout_s:.0f} s")
        if call.error is not None:
            raise call.error
        return call.value

    def submit(self, requests: list[EngineRequest], channels: list[OutputChannel]) -> None:
        """Routes the requests' outputs to `channels`, then submits them (all or none)."""
        with self._lock:
            self._raise_if_gone()
        # A link that goes meanwhile fails the call, which takes the routes away again.
        with m.routed(self._channels, self._lock, requests, channels):
            self.call(m.SUBMIT, requests)

    def abort(self, request_id: str) -> None:
        """Asks the engine to end the request; its end still arrives on its channel."""
        # The engine may be gone, and the request with it.
        with contextlib.suppress(OSError, UnavailableError):
            self._send(m.ABORT, request_id)

    def _send(self, *message: object) -> None:
        try:
            with self._send_lock:
                self._connection.send(message)
        except OSError as error:
            self._gone(f"the engine process is gone ({error})")
            raise UnhealthyError(f"the model can no longer run: {self._failure}") from None

    def _raise_if_gone(self) -> None:
        if self._failure is not None:
            raise UnhealthyError(f"the model can no longer run: {self._failure}")

    def _read(self) -> None:
        try:
            while True:
                message = self._connection.recv()
                kind = message[0]
                if kind == m.OUTPUTS:
                    self._route(decode_outputs(message[1]))
                elif kind in (m.REPLY, m.FAILED):
                    self._answer(kind, message[1], message[2])
        except (EOFError, OSError):
            self._gone("the engine process is gone")
        except Exception as error:  # noqa: BLE001 - a message this side cannot read
            _log.exception("the engine link broke")
            self._gone(f"the engine link broke: {error}")
        finally:
            with self._send_lock:
                self._connection.close()

    def _route(self, batch: list[tuple[str, Output]]) -> None:
        for request_id, item in batch:
            with self._lock:
                channel = self._channels.get(request_id)
                if isinstance(item, RequestEnd):
                    self._channels.pop(request_id, None)
            if channel is not None:
                channel.put(item)

    def _answer(self, kind: str, number: int, value: object) -> None:
        with self._lock:
            call = self._calls.pop(number, None)
        if call is None:
            return  # its caller gave up waiting
        if kind == m.FAILED:
            call.error = value.error()  # type: ignore[attr-defined]
        else:
            call.value = value
        call.done.set()

    def _gone(self, reason: str) -> None:
        with self._lock:
            if self._failure is not None:
                return
            self._failure = reason
            channels = list(self._channels.values())
            calls = list(self._calls.values())
            self._channels.clear()
            self._calls.clear()
        _log.critical("%s; its %d requests here fail", reason, len(channels))
        for channel in channels:
            channel.put(RequestEnd(Usage(0, 0), error=reason))
        for call in calls:
            call.error = UnhealthyError(f"the model can no longer run: {reason}")
            call.done.set()


class RemoteEngine:
    """Implements `ports.engine_client.EngineClient` over the link.

    A request without a grammar is checked here against the engine's own limits, with the
    same rule and so the same messages, without a round trip; one with a grammar is checked
    by the engine process, which compiles the grammar once and keeps it for the submit.
    """

    submit_waits = True  # a submit is answered by the engine process

    def __init__(self, link: EngineLink) -> None:
        self._link = link
        self._hello = link.hello

    @property
    def max_model_len(self) -> int:
        return self._hello.max_model_len

    def check(self, request: EngineRequest) -> CheckedRequest:
        hello = self._hello
        if request.grammar is None:
            return CheckedRequest.check(request, self, hello.limits, hello.max_model_len, None)
        self._link.call(m.CHECK, request)
        return CheckedRequest(request, self)

    def submit_all(self, submissions: list[tuple[CheckedRequest, OutputChannel]]) -> None:
        if any(checked.issuer is not self for checked, _ in submissions):
            raise ValueError("only requests this client checked can be submitted through it")
        self._link.submit(
            [checked.request for checked, _ in submissions],
            [channel for _, channel in submissions],
        )

    def abort(self, request_id: str) -> None:
        self._link.abort(request_id)

    def failure(self) -> str | None:
        """Why the model can no longer run: the link's failure, else the engine's own."""
        if self._link.failure is not None:
            return self._link.failure
        try:
            return self._link.call(m.HEALTH)  # type: ignore[return-value]
        except DomainError as error:
            return error.message


class RemoteResponseStore:
    """Implements `ports.response_store.ResponseStorage`: the store lives in the engine
    process, so a follow-up finds its previous response from any API process. A `put`
    returns once the engine process holds the response."""

    def __init__(self, link: EngineLink) -> None:
        self._link = link

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._link.call(m.STORE_PUT, response_id, stored)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._link.call(m.STORE_GET, response_id)  # type: ignore[return-value]
