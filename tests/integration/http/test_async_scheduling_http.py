"""`--async-scheduling` over HTTP: the tiny model answers every request as the synchronous loop
does (IDs and times aside), streamed or whole, sampled, seeded, with logprobs, stops,
penalties, several choices and prompt logprobs: the same bytes with batch-invariant kernels,
the same tokens and values within rounding without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import MODEL_NAME, serve_tiny
from tests.support.payloads import assert_payloads_agree
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


# contracts/api.md, "Batch-invariant mode": without it the tiny models' values agree within 1e-5.
ROUNDING = 1e-5


def answers(model_dir: Path, async_scheduling: bool, batch_invariant: bool) -> list[dict]:
    served = serve_tiny(
        model_dir,
        async_scheduling=async_scheduling,
        prompt_logprobs=True,
        batch_invariant=batch_invariant,
    )
    try:
        app = create_app(ModelHolder(served=served))
        return [
            record_one(app, "POST", path, {"model": MODEL_NAME, **body}, raw=True)
            for path, body in REQUESTS
        ]
    finally:
        served.stop()


def test_every_answer_is_byte_for_byte_the_synchronous_loops_with_batch_invariant_kernels(
    http_model_dir,
):
    synchronous = answers(http_model_dir, async_scheduling=False, batch_invariant=True)
    overlapped = answers(http_model_dir, async_scheduling=True, batch_invariant=True)

    assert all(answer["status"] == 200 for answer in synchronous), synchronous
    assert overlapped == synchronous


def decoded(answer: dict) -> list[object]:
    """The JSON documents of an answer: the body, or each `data:` frame of a stream."""
    raw = answer["raw"]
    if not raw.startswith("data: "):
        return [json.loads(raw)]
    frames = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    return [json.loads(frame) for frame in frames if frame != "[DONE]"]


def test_without_batch_invariant_kernels_the_tokens_are_the_synchronous_loops_and_values_round(
    http_model_dir,
):
    # A choice that ends is learned one step late, so its lane planned ahead joins a step the
    # synchronous loop runs without it; the other lanes' GEMMs then see another row count.
    synchronous = answers(http_model_dir, async_scheduling=False, batch_invariant=False)
    overlapped = answers(http_model_dir, async_scheduling=True, batch_invariant=False)

    assert all(answer["status"] == 200 for answer in synchronous), synchronous
    for one, other in zip(synchronous, overlapped, strict=True):
        assert_payloads_agree(decoded(one), decoded(other), ROUNDING, where=one["path"])
