"""What crosses the engine socket: message kinds, the greeting and errors as plain values.

Every message is one pickled tuple `(kind, *fields)` framed by `multiprocessing.connection`
(a length prefix per message). Both ends are processes of one `helios serve` that proved the
shared authkey, so unpickling what arrives is as safe as the processes themselves.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

from domain.common.errors import (
    DomainError,
    InvalidRequestError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
    RequestFailedError,
    UnavailableError,
    UnhealthyError,
)
from domain.emission.channel import OutputChannel
from domain.engine.engine import Engine
from domain.logprobs.rules import LogprobLimits
from domain.requests.engine_request import EngineRequest

# API process -> engine process. Calls carry a call id that their reply repeats.
CHECK = "check"  # (call, EngineRequest): a request with a grammar, checked where it compiles
SUBMIT = "submit"  # (call, [EngineRequest, ...]): all admitted, or none and an error reply
ABORT = "abort"  # (request_id,): no reply
STORE_GET = "store_get"  # (call, response_id)
STORE_PUT = "store_put"  # (call, response_id, StoredResponse)
HEALTH = "health"  # (call,): why the model can no longer run, or None

# Engine process -> API process.
HELLO = "hello"  # (Hello,): first message on every connection
REPLY = "reply"  # (call, value)
FAILED = "failed"  # (call, WireError)
# ([(request_id, ChoiceDelta | PromptScores | RequestEnd), ...] as `outputs_codec` writes it,)
OUTPUTS = "outputs"

# A reply that never comes (a wedged engine process) fails the call after this long, so that
# no HTTP request waits forever; a grammar check may take its compile budget on top.
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Hello:
    """What an API process needs to serve next to the engine: the served name, where the
    tokenizer is, and the limits the engine checks requests against (so that an API process
    checks a request without a grammar itself, with the same messages)."""

    name: str
    model_dir: str
    max_model_len: int
    limits: LogprobLimits
    engine_pid: int

    @property
    def allow_logprobs(self) -> bool:
        return self.limits.top_k > 0

    @staticmethod
    def of_this_process(name: str, model_dir: str, engine: Engine) -> Hello:
        """The greeting of the engine process that runs `engine` (this process)."""
        return Hello(name, model_dir, engine.max_model_len, engine.logprob_limits, os.getpid())


# Domain errors that may cross, by name; anything else arrives as a request failure (500).
_KINDS: dict[str, type[DomainError]] = {
    cls.__name__: cls
    for cls in (
        InvalidRequestError,
        NotFoundError,
        OverloadedError,
        NotReadyError,
        UnhealthyError,
        UnavailableError,
        RequestFailedError,
    )
}


@dataclass(frozen=True, slots=True)
class WireError:
    """A domain error as values: its class name, message and `param`."""

    kind: str
    message: str
    param: str | None = None

    @staticmethod
    def of(error: Exception) -> WireError:
        if isinstance(error, DomainError):
            return WireError(type(error).__name__, error.message, error.param)
        return WireError(RequestFailedError.__name__, f"the engine process failed: {error}")

    def error(self) -> DomainError:
        return _KINDS.get(self.kind, RequestFailedError)(self.message, param=self.param)


def hang_up(connection: Connection) -> None:
    """Ends a connection that its reader thread is reading: the read returns (EOF) and the
    peer hears; the reader closes it then. Closing it here instead would leave the read
    and the peer waiting, and race the reader's own close."""
    with (
        contextlib.suppress(OSError),
        socket.socket(fileno=os.dup(connection.fileno())) as view,
    ):
        view.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def routed(
    routes: dict[str, OutputChannel],
    lock: threading.Lock | threading.Condition,
    requests: Sequence[EngineRequest],
    channels: Sequence[OutputChannel],
) -> Iterator[None]:
    """Routes the requests' outputs to their channels before the block submits them (the first
    output may come at once); a submission that raises leaves no route behind."""
    with lock:
        for request, channel in zip(requests, channels, strict=True):
            routes[request.request_id] = channel
    try:
        yield
    except BaseException:
        with lock:
            for request in requests:
                routes.pop(request.request_id, None)
        raise
