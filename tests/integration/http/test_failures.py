"""A failure inside one request fails that request only; a closed stream aborts its request."""

from __future__ import annotations

import pytest

from tests.support.asgi_stream import stream_post
from tests.support.draining import wait_until_idle
from tests.support.sse import data_frames

pytestmark = pytest.mark.model

POISON = 7  # a token ID whose presence in a step makes the wrapped executor fail


@pytest.fixture
def poisoned(served, monkeypatch):
    executor = served.engine._executor
    submit = executor.submit

    def failing_submit(plan):
        if any(POISON in work.token_ids for work in plan.works):
            raise RuntimeError("injected device fault")
        return submit(plan)

    monkeypatch.setattr(executor, "submit", failing_submit)


def test_a_request_that_fails_inside_the_engine_gets_a_500_and_the_next_one_succeeds(
    client, poisoned
):
    failed = client.simulate_post("/v1/completions", json={"prompt": [POISON, 8], "max_tokens": 3})
    ok = client.simulate_post("/v1/completions", json={"prompt": [8, 9], "max_tokens": 3})

    assert failed.status_code == 500
    assert "injected device fault" in failed.json["error"]["message"]
    assert ok.status_code == 200 and ok.json["usage"]["completion_tokens"] == 3


def test_a_failing_streamed_request_ends_with_an_error_frame_and_done(app, poisoned):
    status, text = stream_post(
        app, "/v1/completions", json={"prompt": [POISON], "max_tokens": 3, "stream": True}
    )

    frames = data_frames(text)
    assert status == 200 and frames[-1] == "[DONE]"
    assert '"error"' in frames[-2] and "injected device fault" in frames[-2]


def test_a_client_that_disconnects_mid_stream_aborts_its_request(app, served, served_steps):
    wait_until_idle(served.engine)

    status, text = stream_post(
        app,
        "/v1/completions",
        max_chunks=2,
        json={"prompt": "a long one", "max_tokens": 100, "ignore_eos": True, "stream": True},
    )

    assert status == 200 and len(data_frames(text)) < 50 and "[DONE]" not in text
    wait_until_idle(served.engine)  # the abandoned request was aborted
    assert served_steps.settled(), "every slot and KV block is free again"
