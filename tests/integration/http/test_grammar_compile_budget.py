"""Grammar compiles through the Falcon app over the tiny model: constraints that break a limit
at their first token are 400s naming their field, and a slow compile runs off the event loop
while other streams keep their pace."""

from __future__ import annotations

import asyncio
import time

import pytest
from falcon import testing

from tests.support.asgi_stream import chunk_times

pytestmark = pytest.mark.model

STREAM = {"prompt": "the quick brown", "max_tokens": 100, "temperature": 0, "stream": True}
# A forced literal of 320,000 characters (larger ones break llguidance's lexer limit): about a
# second of llguidance work before the first mask, more under load.
SLOW_REGEX = "(ab){400}{400}"
THOUSANDS_OF_ALTERNATIVES = "start: " + " | ".join(f'"w{i}"' for i in range(3000))
SELF_NESTING = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/completions", {"structured_outputs": {"regex": "\\"}}, "structured_outputs", "lone"),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "nest", "schema": SELF_NESTING},
                }
            },
            "response_format",
            "Too many items",
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"grammar": THOUSANDS_OF_ALTERNATIVES}},
            "structured_outputs",
            "3001 items",
        ),
    ],
)
def test_a_constraint_over_a_limit_at_its_first_token_is_a_400_before_admission(
    client, served, served_steps, path, body, param, words
):
    prompt = (
        {"prompt": "the quick"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    scheduled = len(served_steps.observed("queue_times"))

    response = client.simulate_post(path, json={**prompt, "max_tokens": 8, **body})

    assert response.status_code == 400, response.json
    error = response.json["error"]
    assert error["param"] == param and words in error["message"], error
    # Never admitted: nothing queued or running, and no choice was ever scheduled.
    assert not served.engine.has_work()
    assert len(served_steps.observed("queue_times")) == scheduled


def gaps(times: list[float]) -> list[float]:
    """The gaps between a stream's chunks (its first chunk carries its first token)."""
    return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]


@pytest.mark.slow
def test_a_running_stream_keeps_its_pace_while_a_slow_grammar_compiles(app):
    # An echo with `max_tokens: 0` checks the request (the compile) and admits nothing: the gaps
    # measure the compile alone, not the engine computing this grammar's masks once it runs.
    slow = {
        "prompt": "ab",
        "max_tokens": 0,
        "echo": True,
        "structured_outputs": {"regex": SLOW_REGEX},
    }

    async def scenario() -> tuple[list[float], list[float], float, dict]:
        async with testing.ASGIConductor(app) as conductor:
            alone: list[float] = []
            for _ in range(3):
                alone += gaps(await chunk_times(conductor, "/v1/completions", json=STREAM))
            streaming = asyncio.Event()
            running = asyncio.ensure_future(
                chunk_times(conductor, "/v1/completions", json=STREAM, arrived=streaming)
            )
            await streaming.wait()
            started = time.monotonic()
            compiling = asyncio.ensure_future(conductor.simulate_post("/v1/completions", json=slow))
            during = gaps(await running)
            # Streams started while the compile goes on count too.
            while not compiling.done():
                during += gaps(await chunk_times(conductor, "/v1/completions", json=STREAM))
            response = await compiling
            return alone, during, time.monotonic() - started, response.json

    alone, during, compile_s, answer = asyncio.run(scenario())

    # A compile that held the event loop (or the GIL) would stall the streams: in one gap as
    # long as the compile, or in many long gaps if it let go now and then. On a 2-core CI box
    # the other xdist worker may also starve this process once (765 ms seen), so one long gap
    # is allowed as long as it is far shorter than the compile.
    normal = max(alone)
    stalled = [gap for gap in during if gap > normal + 0.1]
    assert len(stalled) <= 1, (
        f"{len(stalled)} gaps over {(normal + 0.1) * 1e3:.0f} ms while compiling "
        f"(alone at most {normal * 1e3:.0f} ms): {[round(gap * 1e3) for gap in stalled]}"
    )
    # The compile either finishes within its 5 s budget or is refused when that runs out.
    compiled = answer.get("choices", [{}])[0].get("text") == "ab"
    assert compiled or "did not compile within 5 s" in answer["error"]["message"], answer
    # About 1 s on a quiet 2-core box (0.85 s seen), seconds under load: many times a gap.
    assert compile_s >= 0.5, f"the compile took only {compile_s:.2f} s"
    assert max(during) < compile_s / 2, (
        f"a {max(during):.2f} s gap during a {compile_s:.2f} s compile: the compile stalled them"
    )
    assert len(during) >= 50, f"only {len(during)} gaps were measured during the compile"
