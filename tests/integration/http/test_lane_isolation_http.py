"""A grammar that breaks while its request runs fails that request only, through the HTTP app:
a 400 naming the constraint when nothing was sent, an error frame of its own in a stream, and
innocent streams beside it (and beside oversized and abandoned requests) keep every token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from tests.fakes import RecordingObserver
from tests.integration.http.conftest import serve_tiny
from tests.support.asgi_stream import post, read_stream, stream_post
from tests.support.breaking_grammars import row_explosion_grammar
from tests.support.draining import wait_until_idle
from tests.support.sse import data_frames, json_frames
from tests.support.step_gate import StepGate

pytestmark = pytest.mark.model

BREAKING = {"grammar": row_explosion_grammar()}
# References itself through a required property: llguidance gives up on its first token
# ("Too many items"), or admission refuses it; either way it is the request's own 400.
SELF_REFERENCE = {
    "type": "json_schema",
    "json_schema": {
        "name": "loop",
        "schema": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    },
}
INNOCENT_TOKENS = 90
# A shared CI runner can be slow; a stream that has not ended by then is a wedged one.
STREAM_TIMEOUT_S = 180.0
WORDS = ("the", "quick", "brown", "fox", "every", "request", "gets", "its", "own", "slot")


@pytest.fixture(scope="module")
def isolated_steps() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture(scope="module")
def isolated(http_model_dir, isolated_steps) -> Iterator[ServedModel]:
    model = serve_tiny(http_model_dir, max_num_seqs=16, observer=isolated_steps)
    yield model
    model.stop()


@pytest.fixture(scope="module")
def app(isolated):
    return create_app(ModelHolder(served=isolated))


def innocent(index: int) -> dict:
    prompt = " ".join((WORDS[index % len(WORDS) :] + WORDS)[:3])
    return {
        "prompt": prompt,
        "max_tokens": INNOCENT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "stream": True,
    }


def breaking(stream: bool) -> dict:
    return {
        "prompt": "yes or no",
        "max_tokens": 40,
        "temperature": 0,
        "structured_outputs": BREAKING,
        "stream": stream,
    }


def streamed_tokens(text: str) -> tuple[str, list[str], set[str]]:
    """A completion stream's text, its tokens (as `token_id:N`) and the IDs of its frames."""
    body, tokens, ids = "", [], set()
    for frame in json_frames(text):
        assert "error" not in frame, frame
        ids.add(frame["id"])
        for choice in frame["choices"]:
            body += choice["text"]
            if choice.get("logprobs"):
                tokens += choice["logprobs"]["tokens"]
    return body, tokens, ids


def test_a_grammar_that_breaks_mid_output_is_a_400_naming_its_field(app):
    status, body = asyncio.run(post(app, "/v1/completions", json=breaking(False)))

    assert status == 400, body
    error = body["error"]
    assert error["param"] == "structured_outputs" and error["type"] == "BadRequestError"
    assert "grammar" in error["message"] and "2000" in error["message"]
    assert "<state>" not in error["message"] and "group" not in error["message"]


def test_a_streamed_grammar_that_breaks_ends_with_its_own_error_frame(app):
    status, text = stream_post(app, "/v1/completions", json=breaking(True))

    frames = data_frames(text)
    assert status == 200 and frames[-1] == "[DONE]"
    error = json.loads(frames[-2])["error"]
    assert error["param"] == "structured_outputs" and error["code"] == 400
    # What it generated before the grammar broke was sent.
    assert any('"text"' in frame for frame in frames[:-2])


async def queued(engine, tasks: list[asyncio.Task], timeout: float = 60.0) -> None:
    """Waits until each task's request waits in the engine's inbox (its step is held) or was
    answered already (refused before admission)."""
    deadline = time.monotonic() + timeout
    while len(engine._inbox) + sum(task.done() for task in tasks) < len(tasks):  # noqa: SLF001
        if time.monotonic() > deadline:
            raise AssertionError("the troubled requests did not all reach the engine")
        await asyncio.sleep(0.01)


def watch_failures(served: ServedModel, monkeypatch) -> list[int]:
    """For each step that retired a lane: how many innocent lanes ran in it (known by their
    output budget, which every lane's sampling carries)."""
    executor = served.engine._executor  # noqa: SLF001
    submit, read = executor.submit, executor.read
    counts: list[int] = []
    innocents: dict[int, int] = {}

    def watching_submit(plan):
        frame = submit(plan)
        innocents[frame] = sum(
            1 for work in plan.works if work.sampling.params.max_tokens == INNOCENT_TOKENS
        )
        return frame

    def watching_read(frame):
        result = read(frame)
        if result.failures:
            counts.append(innocents[frame])
        return result

    monkeypatch.setattr(executor, "submit", watching_submit)
    monkeypatch.setattr(executor, "read", watching_read)
    return counts


def test_isolation_under_load_every_innocent_stream_keeps_its_exact_tokens(
    app, isolated, isolated_steps, monkeypatch
):
    alone = [
        streamed_tokens(stream_post(app, "/v1/completions", json=innocent(i))[1]) for i in range(8)
    ]
    oversized = {"prompt": [5] * 400, "max_tokens": 4}

    innocents_at_failures = watch_failures(isolated, monkeypatch)

    engine = isolated.engine
    gate = StepGate(engine._executor)  # noqa: SLF001

    async def load():
        innocents = [
            asyncio.create_task(
                read_stream(app, "/v1/completions", json=innocent(i), timeout=STREAM_TIMEOUT_S)
            )
            for i in range(8)
        ]
        # The innocents are admitted and generating when trouble arrives: the engine holds
        # the next step until every troubled request is queued.
        for step in range(1, 5):
            await gate.reached(step)
            gate.allow()
        await gate.reached(5)
        trouble_calls = [
            read_stream(app, "/v1/completions", json=breaking(True)),
            post(app, "/v1/completions", json=breaking(False)),
            post(app, "/v1/completions", json={**breaking(False), "n": 2}),
            post(
                app,
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "loop"}],
                    "max_tokens": 20,
                    "response_format": SELF_REFERENCE,
                },
            ),
            post(app, "/v1/completions", json=oversized),
            # Refused before its stream starts: a plain 400 body.
            post(app, "/v1/completions", json={**oversized, "stream": True}),
            # Clients that leave after two chunks: their requests are aborted.
            read_stream(
                app, "/v1/completions", json={**innocent(9), "max_tokens": 70}, max_chunks=2
            ),
            read_stream(app, "/v1/completions", json={**breaking(True)}, max_chunks=2),
        ]
        trouble = [asyncio.create_task(call) for call in trouble_calls]
        await queued(engine, trouble)
        gate.allow(100_000)
        return await asyncio.gather(*innocents), await asyncio.gather(*trouble)

    try:
        innocents, trouble = asyncio.run(load())
    finally:
        gate.allow(100_000)
        gate.remove()

    for index, (status, text) in enumerate(innocents):
        assert status == 200
        body, tokens, ids = streamed_tokens(text)
        assert len(tokens) == INNOCENT_TOKENS and (body, tokens) == alone[index][:2], index
        assert len(ids) == 1, "every frame is this request's own"
        for word in ("grammar", "constraint", "maximum context", "Parser", "error"):
            assert word not in text, (index, word)
    # Grammars broke in steps that every innocent stream shared.
    assert innocents_at_failures and max(innocents_at_failures) == 8, innocents_at_failures
    streamed, whole, whole_n, schema, too_long, too_long_stream, _, _ = trouble
    assert json.loads(data_frames(streamed[1])[-2])["error"]["param"] == "structured_outputs"
    for status, body in (whole, whole_n):
        assert status == 400 and body["error"]["param"] == "structured_outputs", body
    assert schema[0] == 400 and schema[1]["error"]["param"] == "response_format", schema
    assert too_long[0] == 400 and too_long[1]["error"]["param"] == "prompt"
    assert too_long_stream[0] == 400 and too_long_stream[1]["error"]["param"] == "prompt"
    # Nothing is left running and every slot and block is free again.
    wait_until_idle(engine, timeout=10)
    assert isolated_steps.settled(), "every slot and KV block is free again"
