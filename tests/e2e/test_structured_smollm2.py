"""Structured outputs end to end: real gunicorn, the embedded SmolLM2, the official client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct"
# Requests in flight at once, and the server's --max-num-seqs: wide batches keep the 200 requests
# cheap on two cores and put many constrained lanes (each its own grammar) into every step.
CONCURRENCY = 24
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["kind", "tall", "funny"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    "account": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
                },
                "required": ["id", "email"],
                "additionalProperties": False,
            },
            "status": {"enum": ["open", "closed"]},
        },
        "required": ["user", "status"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
            "express": {"type": "boolean"},
        },
        "required": ["items", "express"],
        "additionalProperties": False,
    },
    "rating": {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 1, "maximum": 5},
            "label": {"enum": ["good", "bad", "fine"]},
        },
        "required": ["score", "label"],
        "additionalProperties": False,
    },
}
REGEXES = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "word": r"[A-Z][a-z]{2,8}",
    "code": r"[A-F0-9]{4}(-[A-F0-9]{4}){1,2}",
}
CHOICES = {
    "sentiment": ["positive", "negative", "neutral"],
    "city": ["Paris", "London", "Berlin", "Madrid"],
    "letter": ["A", "B", "C", "D"],
}


@dataclass(frozen=True)
class Case:
    name: str
    body: dict
    valid: object  # the output text -> raises or returns False when invalid


def cases() -> list[Case]:
    """100 requests: 40 schemas, 32 regexes, 28 choices; each is sent twice (stream, not)."""
    found = []
    for index in range(100):
        seed = 1000 + index
        if index < 40:
            key = list(SCHEMAS)[index % len(SCHEMAS)]
            schema = SCHEMAS[key]
            body = {
                "messages": [{"role": "user", "content": f"Give one {key} record as JSON."}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": key, "schema": schema, "strict": True},
                },
            }
            valid = lambda text, s=schema: jsonschema.validate(json.loads(text), s) is None  # noqa: E731
        elif index < 72:
            key = list(REGEXES)[index % len(REGEXES)]
            pattern = REGEXES[key]
            body = {
                "messages": [{"role": "user", "content": f"Write a {key}."}],
                "structured_outputs": {"regex": pattern},
            }
            valid = lambda text, p=pattern: re.fullmatch(p, text) is not None  # noqa: E731
        else:
            key = list(CHOICES)[index % len(CHOICES)]
            options = CHOICES[key]
            body = {
                "messages": [{"role": "user", "content": f"Pick a {key}."}],
                "structured_outputs": {"choice": options},
            }
            valid = lambda text, o=options: text in o  # noqa: E731
        body.update(model=MODEL, max_tokens=96, temperature=0.8, seed=seed)
        found.append(Case(f"{key}-{index}", body, valid))
    return found


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-structured")
    with running_server(
        None, workdir, "--kv-cache-memory", str(256 << 20), "--max-num-seqs", str(CONCURRENCY)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(smollm2: RunningServer) -> openai.OpenAI:
    return smollm2.openai_client()


def whole(client: openai.OpenAI, case: Case) -> tuple[str, str | None]:
    body = dict(case.body)
    extra = {k: body.pop(k) for k in ("structured_outputs",) if k in body}
    reply = client.chat.completions.create(**body, extra_body=extra)
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


def streamed(client: openai.OpenAI, case: Case) -> tuple[str, str | None]:
    body = dict(case.body)
    extra = {k: body.pop(k) for k in ("structured_outputs",) if k in body}
    text, finish = "", None
    for chunk in client.chat.completions.create(**body, extra_body=extra, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def test_two_hundred_constrained_requests_are_valid_and_streams_equal_whole_answers(client):
    all_cases = cases()

    # CONCURRENCY requests at a time share batches: whole answers and the same cases streamed;
    # a seeded request samples the same tokens whatever the batch around it.
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        wholes = pool.map(lambda c: whole(client, c), all_cases)
        streams = pool.map(lambda c: streamed(client, c), all_cases)
        results = list(zip(all_cases, wholes, streams, strict=True))

    assert len(results) * 2 == 200
    for case, (text, finish), (stream_text, stream_finish) in results:
        assert finish == "stop", (case.name, text)
        assert case.valid(text), (case.name, text)
        assert (stream_text, stream_finish) == (text, finish), case.name


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    species: str = pydantic.Field(pattern="^(cat|dog|fish)$")
    age: int = pydantic.Field(ge=0, le=30)


def test_the_official_clients_parse_with_a_pydantic_model_gets_that_model(client):
    completion = client.beta.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a pet."}],
        response_format=Pet,
        max_tokens=80,
        temperature=0.7,
        seed=3,
    )

    message = completion.choices[0].message
    assert isinstance(message.parsed, Pet)
    assert message.parsed == Pet.model_validate_json(message.content or "")


def test_a_forced_tool_call_arrives_through_the_official_client(client):
    tool = {
        "type": "function",
        "function": {
            "name": "book_table",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Paris", "Rome"]},
                    "people": {"type": "integer", "minimum": 1, "maximum": 8},
                },
                "required": ["city", "people"],
                "additionalProperties": False,
            },
        },
    }

    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Book a table for two in Rome."}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "book_table"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
