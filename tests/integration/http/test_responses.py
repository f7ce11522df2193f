"""`POST /v1/responses` through the Falcon app over the tiny model: objects, events, entries,
the store, forced tool calls and the 400s before admission."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.integration.http.conftest import MODEL_NAME
from tests.support.asgi_stream import post_and_leave, stream_post
from tests.support.sse import named_events

pytestmark = pytest.mark.model

LOGPROBS = ["message.output_text.logprobs"]
GREEDY = {"temperature": 0, "ignore_eos": True}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
# Only the last event (completed, incomplete or failed) has usage; its frame is written whole.
FINAL_USAGE = b'"usage": {"input_tokens"'


def create(client, **body):
    return client.simulate_post("/v1/responses", json={"input": "the quick brown", **body})


def stream(app, **body) -> list[dict]:
    """The stream's events, parsed, after checking each frame's `event:` names its type."""
    request = {"input": "the quick brown", **body, "stream": True}
    status, text = stream_post(app, "/v1/responses", json=request, until=FINAL_USAGE)
    assert status == 200
    return named_events(text)


def message_text(response: dict) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def entries(response: dict) -> list[dict]:
    return [
        entry
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        for entry in part["logprobs"]
    ]


def test_a_response_answers_as_one_assistant_message_with_usage(client, served):
    body = create(client, model=MODEL_NAME, max_output_tokens=5, **GREEDY).json

    rendered = served.tokenizer.apply_chat_template(
        [{"role": "user", "content": "the quick brown"}], add_generation_prompt=True
    )
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["model"] == MODEL_NAME and body["max_output_tokens"] == 5
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    (part,) = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == [] and part["logprobs"] == []
    assert body["usage"]["input_tokens"] == len(
        served.tokenizer.encode(rendered, add_special_tokens=False)
    )
    assert body["usage"]["output_tokens"] == 5 and body["usage"]["total_tokens"] == (
        body["usage"]["input_tokens"] + 5
    )


def test_a_response_cut_by_max_output_tokens_is_incomplete(client):
    body = create(client, max_output_tokens=3, **GREEDY).json

    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_instructions_render_as_a_system_message_ahead_of_the_input(client, served):
    body = create(client, instructions="Be brief.", max_output_tokens=1, **GREEDY).json

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the quick brown"},
    ]
    rendered = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert body["instructions"] == "Be brief."
    assert body["usage"]["input_tokens"] == len(
        served.tokenizer.encode(rendered, add_special_tokens=False)
    )


def test_input_items_render_messages_calls_and_call_outputs_in_order(client, served):
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "noon"},
    ]

    body = create(client, input=items, max_output_tokens=1, **GREEDY).json

    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    rendered = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert body["usage"]["input_tokens"] == len(
        served.tokenizer.encode(rendered, add_special_tokens=False)
    )


def test_included_logprobs_give_one_entry_per_output_token_with_its_bytes(client):
    body = create(
        client, max_output_tokens=6, include=LOGPROBS, top_logprobs=3, seed=4, ignore_eos=True
    ).json

    found = entries(body)
    assert len(found) == 6 and body["top_logprobs"] == 3
    for entry in found:
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] <= 0
        assert entry["token"] == bytes(entry["bytes"]).decode("utf-8", errors="replace")
    joined = b"".join(bytes(entry["bytes"]) for entry in found)
    assert joined.decode("utf-8", errors="replace") == message_text(body)


def test_a_stream_tells_the_same_response_event_by_event(client, app):
    request = {"max_output_tokens": 8, "include": LOGPROBS, "top_logprobs": 2, "seed": 11}
    whole = create(client, **request, ignore_eos=True).json

    events = stream(app, **request, ignore_eos=True)

    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    final = events[-1]["response"]
    assert "".join(d["delta"] for d in deltas) == message_text(final) == message_text(whole)
    assert [x for d in deltas for x in d["logprobs"]] == entries(final) == entries(whole)
    assert events[-4]["logprobs"] == entries(whole)
    assert final["usage"] == whole["usage"]


def test_the_official_event_shapes_hold_for_every_event(app):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)

    for event in stream(app, max_output_tokens=4, include=LOGPROBS, top_logprobs=1, **GREEDY):
        parsed = adapter.validate_python(event)
        assert parsed.type == event["type"]


def test_a_stored_response_can_be_fetched_and_continued(client, served):
    first = create(client, max_output_tokens=4, **GREEDY).json

    fetched = client.simulate_get(f"/v1/responses/{first['id']}")
    follow = create(
        client, input="and then", previous_response_id=first["id"], max_output_tokens=1, **GREEDY
    ).json

    assert fetched.status_code == 200 and fetched.json == first
    messages = [
        {"role": "user", "content": "the quick brown"},
        {"role": "assistant", "content": message_text(first)},
        {"role": "user", "content": "and then"},
    ]
    rendered = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert follow["previous_response_id"] == first["id"]
    assert follow["usage"]["input_tokens"] == len(
        served.tokenizer.encode(rendered, add_special_tokens=False)
    )


def test_a_streamed_response_is_stored_as_it_ended(client, app):
    events = stream(app, max_output_tokens=3, **GREEDY)

    final = events[-1]["response"]
    assert client.simulate_get(f"/v1/responses/{final['id']}").json == final


def test_a_stream_is_stored_before_its_final_event_so_a_client_may_leave_on_it(client, app):
    request = {"input": "the quick brown", "max_output_tokens": 3, "stream": True, **GREEDY}

    text = post_and_leave(app, "/v1/responses", json=request, marker=FINAL_USAGE)

    final = named_events(text)[-1]
    assert final["type"] == "response.incomplete"  # the token limit ended it
    assert client.simulate_get(f"/v1/responses/{final['response']['id']}").json == final["response"]


def test_an_unstored_response_is_not_found_and_cannot_be_continued(client):
    body = create(client, max_output_tokens=1, store=False, **GREEDY).json

    fetched = client.simulate_get(f"/v1/responses/{body['id']}")
    follow = create(client, previous_response_id=body["id"], max_output_tokens=1)

    assert fetched.status_code == 404 and fetched.json["error"]["param"] == "response_id"
    assert follow.status_code == 400
    assert follow.json["error"]["param"] == "previous_response_id"


def test_a_named_tool_choice_answers_with_a_function_call_and_no_entries(client):
    choice = {"type": "function", "name": "get_weather"}

    body = create(
        client, tools=[WEATHER], tool_choice=choice, include=LOGPROBS, max_output_tokens=60, seed=2
    ).json

    (call,) = body["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["id"].startswith("fc_") and call["call_id"]
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
    assert body["tool_choice"] == choice and body["tools"] == [WEATHER]


def test_streamed_call_arguments_concatenate_to_the_whole_call(client, app):
    request = {"tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 90, "seed": 5}
    whole = create(client, **request).json

    events = stream(app, **request)

    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert "".join(deltas) == "".join(d["arguments"] for d in done)
    calls = [item for item in whole["output"] if item["type"] == "function_call"]
    assert [c["arguments"] for c in calls] == [d["arguments"] for d in done]
    assert not any(e["type"].startswith("response.output_text") for e in events)


def test_a_json_schema_text_format_constrains_the_output_text(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    text = {"format": {"type": "json_schema", "name": "t", "schema": schema}}

    body = create(client, text=text, max_output_tokens=40, seed=1).json

    jsonschema.validate(json.loads(message_text(body)), schema)
    assert body["text"] == text


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"bogus": 1}, "bogus", "unknown field"),
        ({"input": None}, "input", "required"),
        ({"input": []}, "input", "non-empty list"),
        ({"input": [{"type": "input_image"}]}, "input", "not supported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input", "text"),
        ({"input": [{"role": "user", "content": "x", "name": "y"}]}, "input", "`name`"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "not served"),
        ({"top_logprobs": 2}, "top_logprobs", "include"),
        ({"logprob_token_ids": [1]}, "logprob_token_ids", "include"),
        ({"include": LOGPROBS, "top_logprobs": 21}, "top_logprobs", "20"),
        ({"max_output_tokens": 0}, "max_output_tokens", ""),
        ({"temperature": -1}, "temperature", ""),
        ({"background": True}, "background", "nothing else"),
        ({"truncation": "auto"}, "truncation", "nothing else"),
        ({"tools": [{"type": "web_search"}]}, "tools", "only function tools"),
        ({"tools": [WEATHER]}, "tool_choice", "auto"),
        ({"tool_choice": "required"}, "tool_choice", "needs `tools`"),
        ({"tool_choice": {"type": "mcp"}}, "tool_choice", "must be"),
        ({"text": {"format": {"type": "json_schema"}}}, "text", "schema"),
        ({"text": {"verbosity": "low"}}, "text", "verbosity"),
        ({"reasoning": {"summary": "auto"}}, "reasoning", "summaries"),
        ({"reasoning": {"effort": "huge"}}, "reasoning", "effort"),
        ({"metadata": {"k": 1}}, "metadata", "string values"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id", "not found"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "unknown field"),
    ],
)
def test_bad_fields_are_a_400_naming_the_field_before_admission(client, extra, param, says):
    result = create(client, **extra)

    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert error["param"] == param and says in error["message"], error
    assert error["type"] == "BadRequestError"


def test_an_unknown_model_is_a_404(client):
    result = create(client, model="nope")

    assert result.status_code == 404 and result.json["error"]["param"] == "model"


def test_reasoning_effort_and_identifiers_are_accepted_and_echoed(client):
    body = create(
        client,
        reasoning={"effort": "low"},
        user="u1",
        metadata={"k": "v"},
        max_output_tokens=1,
        **GREEDY,
    ).json

    assert body["reasoning"]["effort"] == "low" and body["metadata"] == {"k": "v"}
