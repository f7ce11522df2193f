"""Reads a JSON request body within the size limit."""

from __future__ import annotations

import json
from typing import Any

import falcon.asgi

from adapters.http.fields import decimal_int
from domain.common.errors import InvalidRequestError, PayloadTooLargeError


async def read_json(req: falcon.asgi.Request, max_bytes: int) -> Any:
    if req.content_length is not None and req.content_length > max_bytes:
        raise PayloadTooLargeError(f"the request body exceeds {max_bytes} bytes")
    raw = await req.stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(f"the request body exceeds {max_bytes} bytes")
    try:
        return json.loads(raw, parse_int=decimal_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequestError("the request body is nested too deeply") from None
