"""The official `openai` client against `helios serve` running the embedded SmolLM2 with
`--reasoning-parser deepseek_r1 --tool-call-parser hermes --enable-auto-tool-choice`: every
answer starts in reasoning, a thinking budget closes it, and the structured output or forced
tool call that follows parses as without a reasoning parser, the reasoning kept apart.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import RunningServer, running_server
from tests.e2e.test_parsers_smollm2 import MESSAGES, MODEL, Booking, booking_tool

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

PARSERS = (
    *("--reasoning-parser", "deepseek_r1"),
    *("--tool-call-parser", "hermes", "--enable-auto-tool-choice"),
)
BUDGET = {"thinking_token_budget": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-deepseek")
    with running_server(None, workdir, "--kv-cache-memory", str(16 << 20), *PARSERS) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with server.openai_client() as opened:
        yield opened


def test_beta_parse_gets_the_model_after_the_reasoning(client):
    completion = client.beta.chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        response_format=Booking,
        max_tokens=60,
        temperature=0.7,
        seed=3,
        extra_body=BUDGET,
    )

    message = completion.choices[0].message
    assert isinstance(message.parsed, Booking)
    assert message.model_extra["reasoning"]


def test_a_named_tool_call_follows_the_reasoning(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[booking_tool()],
        tool_choice={"type": "function", "function": {"name": "Booking"}},
        max_tokens=60,
        temperature=0,
        extra_body=BUDGET,
    )

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.model_extra["reasoning"]
    (call,) = choice.message.tool_calls
    Booking.model_validate_json(call.function.arguments)


def test_a_streamed_required_call_and_its_reasoning_equal_the_whole_answer(client):
    request = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": [booking_tool()],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 80,
        "temperature": 0,
        "extra_body": BUDGET,
    }
    whole = client.chat.completions.create(**request).choices[0]

    reasoning, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning") or ""
            for call in choice.delta.tool_calls or []:
                arguments += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish

    (call,) = whole.message.tool_calls
    assert whole.finish_reason == finish == "tool_calls"
    assert (reasoning, arguments) == (
        whole.message.model_extra["reasoning"],
        call.function.arguments,
    )
