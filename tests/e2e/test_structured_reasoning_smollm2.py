"""Structured outputs after reasoning, end to end: real gunicorn serving SmolLM2 with
`--reasoning-parser qwen3` and a chat template that opens `<think>`, the official client.

SmolLM2 has no `<think>` token: both markers are several tokens, so the end string is forced
token by token and a model that begins it itself is continued, not restarted. logit_bias on
the end string's first token makes the model close its reasoning by itself after some free
tokens; the grammar then takes over, and the schemas hold no strings it could land in.
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
from adapters.tokenizer.hf_tokenizer import HfTokenizer
from tests.e2e.conftest import RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct"
CONCURRENCY = 8
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
        "{{ '<|im_start|>assistant\\n' }}", "{{ '<|im_start|>assistant\\n<think>\\n' }}"
    )
    assert opened != template, "the template's generation prompt moved"
    config["chat_template"] = opened
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-reasoning")
    flags = ("--served-model-name", MODEL, "--reasoning-parser", "qwen3")
    sizes = ("--kv-cache-memory", str(64 << 20), "--max-num-seqs", str(CONCURRENCY))
    with running_server(model_dir, workdir, *flags, *sizes) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> HfTokenizer:
    return HfTokenizer.from_dir(model_dir)


def ask(client: openai.OpenAI, index: int, **extra: object):
    schema = SCHEMAS[index % len(SCHEMAS)]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Rate the weather today, briefly, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        max_tokens=48,
        temperature=0.8,
        seed=2000 + index,
        **extra,  # type: ignore[arg-type]
    )
    return schema, reply.choices[0]


def test_fifty_schema_requests_reason_freely_then_answer_valid_json(client, tokenizer):
    end_first = tokenizer.encode("</think>", add_special_tokens=False)[0]
    bias = {"logit_bias": {str(end_first): 6}}

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        replies = list(pool.map(lambda i: ask(client, i, **bias), range(50)))

    thought = 0
    for schema, choice in replies:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)
        thought += bool(choice.message.model_extra.get("reasoning"))
    assert thought > 25, "most answers reasoned before the JSON"


def test_a_budget_of_eight_closes_the_reasoning_at_eight_tokens(client, tokenizer):
    no_end = {str(tokenizer.encode("</think>", add_special_tokens=False)[0]): -100}
    for index in range(4):
        schema, choice = ask(
            client, index, logit_bias=no_end, extra_body={"thinking_token_budget": 8}
        )

        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)
        reasoning = choice.message.model_extra["reasoning"]
        # The template's `<think>\n`: the `\n` counts, as the tokens after the start do.
        counted = tokenizer.encode("\n" + reasoning, add_special_tokens=False)
        assert len(counted) == 8, (reasoning, counted)
