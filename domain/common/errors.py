"""Domain errors: each carries the OpenAI error fields that the HTTP adapter renders."""

from __future__ import annotations

# The OpenAI error type of each HTTP status the server answers with.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "PayloadTooLargeError",
    415: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class DomainError(Exception):
    """Base of every rule violation; `status`, `type`, `param` and `code` reach the wire."""

    status = 500

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        """The OpenAI error type of the status."""
        fallback = "BadRequestError" if self.status < 500 else "InternalServerError"
        return ERROR_TYPES.get(self.status, fallback)

    @property
    def code(self) -> int:
        return self.status


class InvalidRequestError(DomainError):
    """The request breaks a rule of the API; rejected before admission."""

    status = 400


class AuthenticationError(DomainError):
    """The request carries no valid API key."""

    status = 401


class NotFoundError(DomainError):
    """The request names something the server does not have, such as an unknown model."""

    status = 404


class RequestFailedError(DomainError):
    """A failure inside one admitted request; that request fails, the server keeps serving."""


class PayloadTooLargeError(DomainError):
    """The request body is larger than the server accepts."""

    status = 413


class UnavailableError(DomainError):
    """The server cannot take the request now; its subclasses say why."""

    status = 503


class OverloadedError(UnavailableError):
    """The admission queue is full."""


class NotReadyError(UnavailableError):
    """The model is still loading."""


class UnhealthyError(UnavailableError):
    """The model can no longer run (a tensor-parallel peer failed); the worker restarts."""


class LogprobDataError(Exception):
    """A frame's payload for a requesting lane is missing or disagrees with its record; the
    request fails (never silently without an entry)."""
