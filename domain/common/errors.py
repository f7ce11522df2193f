"""Domain errors: each carries the OpenAI error fields that the HTTP adapter renders."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every rule violation; `status`, `type`, `param` and `code` reach the wire."""

    status = 500
    type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def code(self) -> int:
        return self.status


class InvalidRequestError(DomainError):
    """The request breaks a rule of the API; rejected before admission."""

    status = 400
    type = "BadRequestError"


class AuthenticationError(DomainError):
    """The request carries no valid API key."""

    status = 401
    type = "AuthenticationError"


class NotFoundError(DomainError):
    """The request names something the server does not have, such as an unknown model."""

    status = 404
    type = "NotFoundError"


class RequestFailedError(DomainError):
    """A failure inside one admitted request; that request fails, the server keeps serving."""

    status = 500
    type = "InternalServerError"


class OverloadedError(DomainError):
    """The admission queue is full."""

    status = 503
    type = "ServiceUnavailableError"


class PayloadTooLargeError(DomainError):
    """The request body is larger than the server accepts."""

    status = 413
    type = "PayloadTooLargeError"


class NotReadyError(DomainError):
    """The model is still loading."""

    status = 503
    type = "ServiceUnavailableError"


class UnhealthyError(DomainError):
    """The model can no longer run (a tensor-parallel peer failed); the worker restarts."""

    status = 503
    type = "ServiceUnavailableError"


class LogprobDataError(Exception):
    """A frame's payload for a requesting lane is missing or disagrees with its record; the
    request fails (never silently without an entry)."""
