"""The official `openai` client against `helios serve` running the embedded SmolLM2 with both
output parsers (`--reasoning-parser qwen3 --tool-call-parser hermes --enable-auto-tool-choice`):
structured outputs parse into a pydantic model, and forced tool calls arrive as tool calls, as
the `instructor` library's TOOLS mode asks for them (a named function, its arguments read from
`message.tool_calls[0].function.arguments`)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pydantic
import pytest

from tests.e2e.conftest import RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct"
PARSERS = (
    *("--reasoning-parser", "qwen3"),
    *("--tool-call-parser", "hermes", "--enable-auto-tool-choice"),
)


class Booking(pydantic.BaseModel):
    city: str = pydantic.Field(pattern="^(Paris|Rome)$")
    people: int = pydantic.Field(ge=1, le=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-parsers")
    with running_server(None, workdir, "--kv-cache-memory", str(16 << 20), *PARSERS) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with server.openai_client() as opened:
        yield opened


def booking_tool() -> dict:
    """The tool instructor's TOOLS mode sends for a response model: its schema as parameters."""
    return {
        "type": "function",
        "function": {
            "name": "Booking",
            "description": "Correctly extracted `Booking` with all the required parameters",
            "parameters": Booking.model_json_schema(),
        },
    }


MESSAGES = [{"role": "user", "content": "Book a table for two in Rome."}]


def test_beta_parse_gets_the_pydantic_model_with_both_parsers_on(client):
    completion = client.beta.chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        response_format=Booking,
        max_tokens=60,
        temperature=0.7,
        seed=3,
    )

    message = completion.choices[0].message
    assert isinstance(message.parsed, Booking)
    assert message.parsed == Booking.model_validate_json(message.content or "")
    assert completion.choices[0].finish_reason == "stop"


def test_instructors_tools_mode_request_gets_a_tool_call_it_can_validate(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[booking_tool()],
        tool_choice={"type": "function", "function": {"name": "Booking"}},
        max_tokens=60,
        temperature=0,
    )

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "Booking" and call.id.startswith("chatcmpl-tool-")
    Booking.model_validate_json(call.function.arguments)


def test_a_required_tool_call_streams_to_the_whole_call(client):
    request = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": [booking_tool()],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 80,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request).choices[0]

    name, arguments, content, finish = None, "", "", None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name = (call.function and call.function.name) or name
                arguments += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish

    (call,) = whole.message.tool_calls
    assert whole.finish_reason == finish == "tool_calls"
    assert (name, arguments, content) == (call.function.name, call.function.arguments, "")
    Booking.model_validate_json(arguments)


def test_a_forced_call_is_a_function_call_item_in_responses(client):
    response = client.responses.create(
        model=MODEL,
        input=MESSAGES[0]["content"],
        tools=[{"type": "function", **booking_tool()["function"]}],
        tool_choice={"type": "function", "name": "Booking"},
        max_output_tokens=60,
        temperature=0,
    )

    (item,) = response.output
    assert item.type == "function_call" and item.name == "Booking"
    assert response.status == "completed"
    Booking.model_validate_json(item.arguments)
