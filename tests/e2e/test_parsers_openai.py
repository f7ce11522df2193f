"""The official `openai` client against `helios serve` with the hermes tool-call parser, the
qwen3 reasoning parser and a thinking budget, over the tiny marker model.

The model's template opens `<think>`, so every answer starts in reasoning. Tool-call answers
are steered with a one-choice grammar (their logprobs stay the model's raw values); budget
answers with logit_bias that keeps the model from writing either marker itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from adapters.tokenizer.hf import HfTokenizer
from tests.e2e.conftest import RunningServer, running_server
from tests.support.tiny_serving import build_thinking_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CLIENT_TIMEOUT_S = 30.0
MESSAGES = [{"role": "user", "content": "the weather in Oslo"}]
ARGUMENTS = {"city": "Oslo", "days": 2}
CALL = json.dumps({"name": "get_weather", "arguments": ARGUMENTS})
STEERED = f"hm</think>new slot<tool_call>{CALL}</tool_call>"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
REASONING_CONFIG = json.dumps({"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model_dir(tmp_path_factory.mktemp("e2e-thinking"))


@pytest.fixture(scope="module")
def parsing_server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    flags = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    reasoning = ("--reasoning-parser", "qwen3", "--reasoning-config", REASONING_CONFIG)
    # The steering grammar spells the reasoning too, as vLLM's `enable_in_reasoning` allows.
    reasoning += ("--structured-outputs-config", '{"enable_in_reasoning": true}')
    workdir = tmp_path_factory.mktemp("e2e-parsing-server")
    with running_server(model_dir, workdir, *flags, *reasoning) as running:
        yield running


@pytest.fixture(scope="module")
def client(parsing_server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{parsing_server.base_url}/v1",
        api_key="x",
        max_retries=0,
        timeout=CLIENT_TIMEOUT_S,
    ) as opened:
        yield opened


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> HfTokenizer:
    return HfTokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def no_markers(tokenizer: HfTokenizer) -> dict[str, int]:
    ids = [tokenizer.encode(s, add_special_tokens=False) for s in ("<think>", "</think>")]
    return {str(token): -100 for (token,) in ids}


def tool_call_request(model: str, **extra: object) -> dict:
    return {
        "model": model,
        "messages": MESSAGES,
        "tools": [WEATHER],
        "tool_choice": "auto",
        "max_tokens": 200,
        "extra_body": {"structured_outputs": {"choice": [STEERED]}},
        **extra,
    }


def test_the_client_parses_a_hermes_tool_call_and_the_reasoning(client, model):
    response = client.chat.completions.create(**tool_call_request(model), logprobs=True)

    choice = response.choices[0]
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "new slot"
    assert choice.message.model_extra["reasoning_content"] == "hm"
    assert choice.message.model_extra["reasoning"] == "hm"
    # Entries for the content tokens only: reasoning, markers and tool JSON have none.
    entries = choice.logprobs.content
    assert b"".join(bytes(e.bytes) for e in entries) == b"new slot"


def test_a_streamed_tool_call_assembles_to_the_whole_answer(client, model):
    whole = client.chat.completions.create(**tool_call_request(model)).choices[0]

    reasoning, content, calls, finish = "", "", {}, None
    stream = client.chat.completions.create(**tool_call_request(model), stream=True)
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function and call.function.name:
                    slot["name"] = call.function.name
                slot["arguments"] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish

    assert (reasoning, content, finish) == ("hm", "new slot", "tool_calls")
    (call,) = whole.message.tool_calls
    assert list(calls.values()) == [
        {"id": calls[0]["id"], "name": call.function.name, "arguments": call.function.arguments}
    ]
    assert calls[0]["id"].startswith("chatcmpl-tool-")


def test_a_thinking_budget_closes_the_reasoning_and_the_answer_goes_on(
    client, model, tokenizer, no_markers
):
    budget = {"thinking_token_budget": 3, "ignore_eos": True}
    common = {"model": model, "max_tokens": 10, "seed": 8, "logit_bias": no_markers}
    response = client.chat.completions.create(
        messages=MESSAGES, logprobs=True, extra_body=budget, **common
    )
    # The same templated prompt through completions shows every sampled token.
    plain = client.completions.create(
        prompt=tokenizer.apply_chat_template(MESSAGES),
        logprobs=0,
        extra_body={**budget, "return_tokens_as_token_ids": True},
        **common,
    )

    message = response.choices[0].message
    reasoning, content = plain.choices[0].text.split("</think>")
    assert (message.model_extra["reasoning_content"], message.content) == (reasoning, content)
    sampled = plain.choices[0].logprobs.tokens
    # Ten tokens: three of reasoning, the forced end (no entry), six of answer.
    assert response.usage.completion_tokens == plain.usage.completion_tokens == 10
    assert len(sampled) == 9
    entries = response.choices[0].logprobs.content
    assert 0 < len(entries) <= 6
    assert [e.logprob for e in entries] == pytest.approx(
        plain.choices[0].logprobs.token_logprobs[-len(entries) :], abs=1e-6
    )


def test_a_negative_thinking_budget_is_a_400_naming_it(client, model):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=model, messages=MESSAGES, extra_body={"thinking_token_budget": -1}
        )

    assert raised.value.status_code == 400
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["param"] == "thinking_token_budget"
