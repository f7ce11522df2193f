"""Stream frames written by `DataEvent` are the bytes falcon's own `SSEvent` writes."""

from __future__ import annotations

import pytest
from falcon.asgi import SSEvent

from adapters.http.sse import DataEvent, done_event, json_event

PAYLOADS = [
    b"[DONE]",
    b"",
    b'{"text":"caf\xc3\xa9 \xf0\x9f\x98\x80","logprob":-0.0001}',
    b'{"token":"%b","bytes":[37,98]}',  # a `%` in the payload stays as it is
    b'{"text":"a\\nb"}',
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_data_frame_has_falcon_s_bytes(payload: bytes) -> None:
    assert DataEvent(payload).serialize() == SSEvent(data=payload).serialize()


def test_the_stream_s_json_and_done_frames_read_as_vllm_writes_them() -> None:
    assert json_event({"id": "x", "n": 1}).serialize() == b'data: {"id":"x","n":1}\n\n'
    assert done_event().serialize() == b"data: [DONE]\n\n"
