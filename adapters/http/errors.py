"""The one path from any error to an OpenAI error envelope."""

from __future__ import annotations

import logging

import falcon
import falcon.asgi

from domain.common.errors import DomainError, NotReadyError, OverloadedError, UnhealthyError
from domain.presentation.objects import error_object
from ports.metrics import RejectionObserver

_log = logging.getLogger(__name__)


class _HttpError(DomainError):
    """A framework error (unknown route, wrong method) seen through the domain's envelope, its
    type the one the domain gives its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# The `reason` label of `helios:requests_rejected_total`, by status; 503 is told apart by class.
_REASONS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    500: "internal_error",
}


def rejection_reason(error: DomainError) -> str:
    if isinstance(error, OverloadedError):
        return "overloaded"
    if isinstance(error, NotReadyError):
        return "not_ready"
    if isinstance(error, UnhealthyError):
        return "unhealthy"
    return _REASONS.get(error.status, f"status_{error.status}")


class _Uncounted:
    def request_rejected(self, reason: str) -> None:
        return None


class _ErrorPath:
    """Renders every error as the envelope and counts it once, by reason."""

    def __init__(self, rejections: RejectionObserver) -> None:
        self._rejections = rejections

    def _render(self, resp: falcon.asgi.Response, error: DomainError) -> None:
        resp.status = error.status
        resp.media = error_object(error)
        self._rejections.request_rejected(rejection_reason(error))

    async def domain_error(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        error: DomainError,
        params: dict,
    ) -> None:
        self._render(resp, error)

    async def http_error(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        error: falcon.HTTPError,
        params: dict,
    ) -> None:
        message = error.description or error.title or "request failed"
        self._render(resp, _HttpError(error.status_code, message))
        for name, value in dict(error.headers or {}).items():
            resp.set_header(name, value)

    async def unexpected(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, error: Exception, params: dict
    ) -> None:
        _log.exception("unhandled error on %s %s", req.method, req.path)
        self._render(resp, _HttpError(500, f"internal error: {type(error).__name__}"))


def register(app: falcon.asgi.App, rejections: RejectionObserver | None = None) -> None:
    path = _ErrorPath(rejections or _Uncounted())
    # Falcon picks the most specific registered type along the exception's MRO.
    app.add_error_handler(Exception, path.unexpected)
    app.add_error_handler(falcon.HTTPError, path.http_error)
    app.add_error_handler(DomainError, path.domain_error)
