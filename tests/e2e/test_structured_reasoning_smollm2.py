"""Structured outputs after reasoning, end to end: real gunicorn serving SmolLM2 with
`--reasoning-parser qwen3` and a chat template that opens `<think>`, the official client.

SmolLM2 has no `<think>` token: both markers are several tokens, so the end string is forced
token by token and a model that begins it itself is continued, not restarted. SmolLM2 never
closes a block itself, so the budget does; logit_bias keeps it from ending with EOS inside its
reasoning (which would leave no content), and changes nothing the grammar decides alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

from adapters.gpu.loading.default_model import default_model_dir
from adapters.tokenizer.hf import HfTokenizer
from tests.e2e.conftest import RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct"
# Requests in flight at once, and the server's --max-num-seqs: the fifty requests run in two
# waves, each step holding many constrained lanes at once.
CONCURRENCY = 25
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 1, "maximum": 5},
            "label": {"enum": ["good", "bad", "fine"]},
        },
        "required": ["score", "label"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"express": {"type": "boolean"}, "qty": {"enum": [1, 2, 3]}},
        "required": ["express", "qty"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 whose chat template ends the generation prompt with `<think>\\n`."""
    source = default_model_dir(progress=False)
    directory = tmp_path_factory.mktemp("smollm2-thinking")
    for path in source.iterdir():
        if path.name != "tokenizer_config.json":
            os.symlink(path, directory / path.name)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = config["chat_template"]
    opened = template.replace(
        "{{ '<|im_start|>assistant\n' }}", "{{ '<|im_start|>assistant\n<think>\n' }}"
    )
    assert opened != template, "the template's generation prompt moved"
    config["chat_template"] = opened
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-reasoning")
    flags = ("--served-model-name", MODEL, "--reasoning-parser", "qwen3")
    sizes = ("--kv-cache-memory", str(128 << 20), "--max-num-seqs", str(CONCURRENCY))
    with running_server(model_dir, workdir, *flags, *sizes) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return server.openai_client()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> HfTokenizer:
    return HfTokenizer.from_dir(model_dir)


MESSAGES = [{"role": "user", "content": "Rate the weather today, briefly, as JSON."}]


def response_format(index: int) -> dict:
    schema = SCHEMAS[index % len(SCHEMAS)]
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}


def no_eos(tokenizer: HfTokenizer) -> dict[str, int]:
    """Keeps the model from ending inside its reasoning; once the JSON is complete the grammar
    allows EOS alone, which then ends the choice whatever its bias."""
    return {str(token): -100 for token in tokenizer.eos_token_ids}


def ask(client: openai.OpenAI, index: int, budget: int, bias: dict[str, int]):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        response_format=response_format(index),  # type: ignore[arg-type]
        max_tokens=48,
        temperature=0.8,
        seed=2000 + index,
        logit_bias=bias,
        extra_body={"thinking_token_budget": budget},
    )
    return reply.choices[0]


def test_fifty_schema_requests_reason_freely_then_answer_valid_json(client, tokenizer):
    # SmolLM2 never learned `</think>`: a budget closes what the model does not.
    bias = no_eos(tokenizer)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        replies = list(pool.map(lambda i: ask(client, i, 16, bias), range(50)))

    for index, choice in enumerate(replies):
        schema = SCHEMAS[index % len(SCHEMAS)]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)
        reasoning = choice.message.model_extra["reasoning"]
        assert reasoning and "</think>" not in reasoning, choice


def test_a_budget_of_eight_closes_the_reasoning_at_eight_tokens(client, tokenizer):
    prompt = tokenizer.apply_chat_template(MESSAGES)
    assert prompt.endswith("<think>\n")
    for index in range(3):
        chat = ask(client, index, 8, no_eos(tokenizer))
        raw = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=48,
            temperature=0.8,
            seed=2000 + index,
            logprobs=0,
            logit_bias=no_eos(tokenizer),  # type: ignore[arg-type]
            extra_body={
                "thinking_token_budget": 8,
                "response_format": response_format(index),
                "return_tokens_as_token_ids": True,
            },
        ).choices[0]

        reasoning, content = raw.text.split("</think>")
        assert (reasoning, content) == (chat.message.model_extra["reasoning"], chat.message.content)
        jsonschema.validate(json.loads(content), SCHEMAS[index % len(SCHEMAS)])
        # The block counts the prompt's `\n` after `<think>` and seven sampled tokens (a start
        # of the end string among them, if the model began it); the rest of the end is forced
        # and has no entry, so the sampled tokens after those seven are the JSON.
        sampled = [int(t.removeprefix("token_id:")) for t in raw.logprobs.tokens]
        thought = tokenizer.decode(sampled[:7], skip_special_tokens=False)
        assert f"{reasoning}</think>".startswith(thought) and len(thought) >= len(reasoning)
        assert tokenizer.decode(sampled[7:], skip_special_tokens=False) == content
