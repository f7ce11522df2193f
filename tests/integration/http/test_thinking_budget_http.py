"""The thinking budget over the tiny marker model: the block closes at the budget with a forced
`</think>` that has no entry, every sampled token keeps the model's exact value and the noise
of its own position, usage counts the forced token, and streams equal whole answers.

logit_bias keeps the model from writing either marker itself, so every `</think>` in an
output was forced; it changes sampling only, never the reported values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import pytest
import torch
from falcon import testing

from adapters.cli.serve_config import ServeConfig
from adapters.gpu.sampling.philox import philox_uniform
from adapters.gpu.sampling.sampler import SAMPLE_STREAM
from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from domain.parsers.settings import ParserSettings, ReasoningStrings
from tests.integration.http.conftest import serve_tiny
from tests.support.asgi_stream import stream_post
from tests.support.sse import json_frames
from tests.support.tiny_serving import build_thinking_model_dir

pytestmark = pytest.mark.model

PROMPT = "the quick brown fox<think>"
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return build_thinking_model_dir(tmp_path_factory.mktemp("thinking"))


@pytest.fixture(scope="module")
def thinking_served(model_dir) -> Iterator[ServedModel]:
    model = serve_tiny(model_dir, max_model_len=256)
    yield model
    model.stop()


@pytest.fixture(scope="module")
def app(thinking_served):
    parsers = ParserSettings(reasoning_parser="qwen3")
    return create_app(ModelHolder(served=dataclasses.replace(thinking_served, parsers=parsers)))


@pytest.fixture(scope="module")
def markers(thinking_served) -> tuple[int, int]:
    encode = thinking_served.tokenizer.encode
    ((start,), (end,)) = (encode(s, add_special_tokens=False) for s in ("<think>", "</think>"))
    return start, end


@pytest.fixture(scope="module")
def no_markers(markers) -> dict[str, int]:
    return {str(token): -100 for token in markers}


@pytest.fixture(scope="module")
def log_softmax(model_dir) -> Callable[[list[int]], torch.Tensor]:
    """Token IDs -> float64 log_softmax of transformers' FP32 logits; row i predicts i + 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def rows(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([token_ids])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1)

    return rows


def completion(app, **body) -> dict:
    result = testing.TestClient(app).simulate_post("/v1/completions", json=body)
    assert result.status_code == 200, result.text
    return result.json


def budget_body(no_markers, budget: int, **body) -> dict:
    return {
        "prompt": PROMPT,
        "max_tokens": 12,
        "thinking_token_budget": budget,
        "logprobs": 3,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
        "seed": 11,
        "logit_bias": no_markers,
        **body,
    }


def sampled_ids(logprobs: dict) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]


def test_reasoning_closes_exactly_at_the_budget_and_the_forced_end_has_no_entry(
    app, thinking_served, markers, no_markers
):
    answer = completion(app, **budget_body(no_markers, 4))

    choice = answer["choices"][0]
    sampled = sampled_ids(choice["logprobs"])
    end = markers[1]
    assert end not in sampled
    # The whole output: four reasoning tokens, the forced end, then the answer.
    full = [*sampled[:4], end, *sampled[4:]]
    decode = thinking_served.tokenizer.decode
    assert decode(full, skip_special_tokens=False) == choice["text"]
    assert choice["text"].count("</think>") == 1
    assert choice["logprobs"]["text_offset"][4] == len(decode(sampled[:4]) + "</think>")
    assert answer["usage"]["completion_tokens"] == len(full) == 12


def test_sampled_entries_equal_float64_log_softmax_with_the_forced_token_in_context(
    app, thinking_served, markers, no_markers, log_softmax
):
    choice = completion(app, **budget_body(no_markers, 3))["choices"][0]

    sampled = sampled_ids(choice["logprobs"])
    full = [*sampled[:3], markers[1], *sampled[3:]]
    prompt = thinking_served.tokenizer.encode(PROMPT)
    rows = log_softmax(prompt + full)
    sampled_at = [i for i in range(len(full)) if i != 3]
    for value, top, index in zip(
        choice["logprobs"]["token_logprobs"],
        choice["logprobs"]["top_logprobs"],
        sampled_at,
        strict=True,
    ):
        expected = rows[len(prompt) - 1 + index]
        assert math.isclose(value, expected[full[index]].item(), abs_tol=1e-4)
        for key, alternative in top.items():
            token = int(key.removeprefix("token_id:"))
            assert math.isclose(alternative, expected[token].item(), abs_tol=1e-4)


def test_sampled_tokens_after_the_forced_end_draw_the_noise_of_their_own_positions(
    app, thinking_served, markers, no_markers, log_softmax
):
    # Noise is keyed by (seed, position): the forced position draws nothing, and each later
    # token is the Gumbel-max of its raw logits under Philox(seed, its position).
    seed = 23
    choice = completion(app, **budget_body(no_markers, 2, seed=seed))["choices"][0]

    sampled = sampled_ids(choice["logprobs"])
    full = [*sampled[:2], markers[1], *sampled[2:]]
    prompt = thinking_served.tokenizer.encode(PROMPT)
    rows = log_softmax(prompt + full)
    vocab = rows.shape[1]
    bias = torch.zeros(vocab, dtype=torch.float64)
    bias[list(markers)] = -100.0
    for index in range(3, len(full)):
        position = len(prompt) + index
        uniform = philox_uniform(
            torch.tensor([seed]), torch.tensor([position]), vocab, SAMPLE_STREAM
        )[0]
        gumbel = -torch.log(-torch.log(uniform.double()))
        drawn = int((rows[position - 1] + bias + gumbel).argmax())
        assert drawn == full[index], f"output token {index} at position {position}"


def test_a_zero_budget_forces_the_end_first(app, markers, no_markers):
    choice = completion(app, **budget_body(no_markers, 0, max_tokens=5))["choices"][0]

    assert choice["text"].startswith("</think>")
    assert len(choice["logprobs"]["tokens"]) == 4


def test_a_completion_stream_equals_the_whole_answer(app, no_markers):
    body = budget_body(no_markers, 5)
    whole = completion(app, **body)["choices"][0]

    _, text = stream_post(app, "/v1/completions", json={**body, "stream": True})
    joined = {"text": "", "tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in json_frames(text):
        for choice in chunk["choices"]:
            joined["text"] += choice["text"]
            for key in ("tokens", "token_logprobs", "text_offset"):
                joined[key] += (choice["logprobs"] or {}).get(key, [])

    assert joined["text"] == whole["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert joined[key] == whole["logprobs"][key]


def chat(app, **body) -> dict:
    result = testing.TestClient(app).simulate_post(
        "/v1/chat/completions", json={"messages": MESSAGES, **body}
    )
    assert result.status_code == 200, result.text
    return result.json


def test_chat_reasoning_from_the_template_holds_the_budget_and_the_answer_goes_on(
    app, thinking_served, markers, no_markers
):
    body = {
        "max_tokens": 10,
        "thinking_token_budget": 3,
        "ignore_eos": True,
        "n": 2,
        "seed": 4,
        "logit_bias": no_markers,
    }
    answer = chat(app, **body, logprobs=True)
    # The same prompt through completions: its choices draw what the chat choices draw, and
    # show every token ID.
    prompt = thinking_served.tokenizer.apply_chat_template(MESSAGES)
    raw = completion(app, prompt=prompt, logprobs=0, return_tokens_as_token_ids=True, **body)

    for choice, plain in zip(answer["choices"], raw["choices"], strict=True):
        message = choice["message"]
        reasoning, content = plain["text"].split("</think>")
        assert (message["reasoning"], message["content"]) == (reasoning, content)
        # Ten tokens, one of them forced: nine entries, and the forced end is not among them.
        assert markers[1] not in sampled_ids(plain["logprobs"])
        assert len(plain["logprobs"]["token_logprobs"]) == 9
        # Content entries only: the reasoning tokens and the forced end have none.
        entries = choice["logprobs"]["content"]
        assert 0 < len(entries) <= 10 - 3 - 1
        assert [e["logprob"] for e in entries] == pytest.approx(
            plain["logprobs"]["token_logprobs"][-len(entries) :], abs=1e-6
        )
    assert answer["usage"]["completion_tokens"] == raw["usage"]["completion_tokens"] == 2 * 10

    stream_body = {**body, "messages": MESSAGES, "stream": True}
    _, text = stream_post(app, "/v1/chat/completions", json=stream_body)
    streamed: dict[int, dict] = {}
    for chunk in json_frames(text):
        for choice in chunk["choices"]:
            parts = streamed.setdefault(choice["index"], {"reasoning": "", "content": ""})
            parts["reasoning"] += choice["delta"].get("reasoning") or ""
            parts["content"] += choice["delta"].get("content") or ""
    for choice in answer["choices"]:
        message = choice["message"]
        assert streamed[choice["index"]] == {
            "reasoning": message["reasoning"],
            "content": message["content"],
        }


@pytest.mark.parametrize("value", [-1, 2**31, "3", 1.5, True])
def test_a_budget_outside_the_range_is_a_400_naming_it(app, value):
    result = testing.TestClient(app).simulate_post(
        "/v1/completions", json={"prompt": PROMPT, "thinking_token_budget": value}
    )

    assert result.status_code == 400, result.text
    assert result.json["error"]["param"] == "thinking_token_budget"


def test_a_budget_without_a_reasoning_parser_or_config_is_a_400(thinking_served):
    plain = create_app(ModelHolder(served=thinking_served))
    result = testing.TestClient(plain).simulate_post(
        "/v1/chat/completions", json={"messages": MESSAGES, "thinking_token_budget": 4}
    )

    assert result.status_code == 400
    assert result.json["error"]["param"] == "thinking_token_budget"
    assert "--reasoning-parser" in result.json["error"]["message"]


def test_a_reasoning_config_alone_enables_the_budget(thinking_served, markers, no_markers):
    parsers = ParserSettings(reasoning_configured=True)
    configured = create_app(
        ModelHolder(served=dataclasses.replace(thinking_served, parsers=parsers))
    )

    choice = completion(configured, **budget_body(no_markers, 2))["choices"][0]

    assert sampled_ids(choice["logprobs"])[2] != markers[1]
    assert "</think>" in choice["text"]


def test_the_serve_flags_decide_where_the_budget_strings_come_from():
    config = '{"reasoning_start_str": "[[", "reasoning_end_str": "]]"}'

    assert ServeConfig().parsers.budget_strings is None
    assert ServeConfig(reasoning_config=config).parsers.budget_strings == ReasoningStrings(
        "[[", "]]"
    )
    assert ServeConfig(reasoning_parser="qwen3").parsers.budget_strings == ReasoningStrings()
