"""The one path from any error to an OpenAI error envelope."""

from __future__ import annotations

import logging

import falcon
import falcon.asgi

from domain.errors import DomainError
from domain.presentation import error_object

_log = logging.getLogger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "PayloadTooLargeError",
    415: "BadRequestError",
}


class _HttpError(DomainError):
    """A framework error (unknown route, wrong method) seen through the domain's envelope."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = _TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")


def _render(resp: falcon.asgi.Response, error: DomainError) -> None:
    resp.status = error.status
    resp.media = error_object(error)


async def handle_domain_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, error: DomainError, params: dict
) -> None:
    _render(resp, error)


async def handle_http_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, error: falcon.HTTPError, params: dict
) -> None:
    message = error.description or error.title or "request failed"
    _render(resp, _HttpError(error.status_code, message))
    for name, value in dict(error.headers or {}).items():
        resp.set_header(name, value)


async def handle_unexpected(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, error: Exception, params: dict
) -> None:
    _log.exception("unhandled error on %s %s", req.method, req.path)
    _render(resp, _HttpError(500, f"internal error: {type(error).__name__}"))


def register(app: falcon.asgi.App) -> None:
    # Falcon picks the most specific registered type along the exception's MRO.
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(DomainError, handle_domain_error)
