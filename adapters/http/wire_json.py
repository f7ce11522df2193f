"""JSON of completion and chat bodies and stream frames: msgspec, chosen by measurement.

Under `bench/bookkeeping.py --profile` a K=20 stream chunk took 50 us in `json.dumps` and 4 us
in msgspec (chat: 120 and 10 us; docs/performance.md). msgspec writes no whitespace between
tokens, the same strings and the same shortest float digits; it spells exponents its own way
(`1e-7` where `json.dumps` writes `1e-07`), so values presentation marked as `ReprFloat` are
written as `repr` writes them, and the float text on the wire is the one `json.dumps` wrote.
`JsonText` (JSON already written, `adapters/http/logprob_json`) is written as it stands.
"""

from __future__ import annotations

import json
import math
from typing import Any

import falcon
import falcon.asgi
import msgspec

from domain.common.wire import JsonText, ReprFloat


def _marked(value: Any) -> msgspec.Raw:
    if isinstance(value, JsonText):
        return msgspec.Raw(value)
    if isinstance(value, ReprFloat):
        # json.dumps spells the non-finite ones NaN, Infinity, -Infinity.
        plain = float(value)
        text = float.__repr__(plain) if math.isfinite(plain) else json.dumps(plain)
        return msgspec.Raw(text.encode())
    raise TypeError(f"{type(value).__name__} is not JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_marked)


def encode(payload: Any) -> bytes:
    """`payload` (presentation's JSON values) as compact JSON bytes."""
    return _ENCODER.encode(payload)


def send(resp: falcon.asgi.Response, body: Any) -> None:
    """Sets `body` as the response's JSON media, encoded here rather than by the app's handler."""
    resp.data = encode(body)
    resp.content_type = falcon.MEDIA_JSON
