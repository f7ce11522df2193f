"""`--async-scheduling` over HTTP: the tiny model answers every request with the bytes the
synchronous loop sends (IDs and times aside), streamed or whole, sampled, seeded, with
logprobs, stops, penalties, several choices and prompt logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import MODEL_NAME, serve_tiny
from tests.support.wire_snapshot import record_one

pytestmark = pytest.mark.model

SEEDED = {"temperature": 0.9, "seed": 7}
REQUESTS = (
    (
        "/v1/completions",
        {"prompt": "the quick brown fox", "max_tokens": 12, "logprobs": 5, **SEEDED},
    ),
    (
        "/v1/completions",
        {"prompt": "once upon a time", "max_tokens": 9, "n": 3, "logprobs": 2, **SEEDED},
    ),
    (
        "/v1/completions",
        {"prompt": "yes no yes", "max_tokens": 6, "temperature": 0, "prompt_logprobs": 2},
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "count to ten"}],
            "max_tokens": 16,
            "logprobs": True,
            "top_logprobs": 3,
            "stream": True,
            "stop": [" e"],
            **SEEDED,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "say something"}],
            "max_tokens": 20,
            "min_tokens": 4,
            "frequency_penalty": 0.5,
            "temperature": 0,
            "n": 2,
        },
    ),
)


def answers(model_dir: Path, async_scheduling: bool) -> list[dict]:
    served = serve_tiny(model_dir, async_scheduling=async_scheduling, prompt_logprobs=True)
    try:
        app = create_app(ModelHolder(served=served))
        return [
            record_one(app, "POST", path, {"model": MODEL_NAME, **body}, raw=True)
            for path, body in REQUESTS
        ]
    finally:
        served.stop()


def test_every_answer_is_byte_for_byte_the_synchronous_loops(http_model_dir):
    synchronous = answers(http_model_dir, async_scheduling=False)
    overlapped = answers(http_model_dir, async_scheduling=True)

    assert all(answer["status"] == 200 for answer in synchronous), synchronous
    assert overlapped == synchronous
