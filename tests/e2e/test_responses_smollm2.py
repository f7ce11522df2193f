"""The Responses API end to end: real gunicorn, the embedded SmolLM2, the official client
parsing every object and event, with output-text logprobs."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import RunningServer, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct"
LOGPROBS = ["message.output_text.logprobs"]
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about tea.",
    "Name three colours. Answer in French: é, à, ü welcome.",
)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("smollm2-responses")
    with running_server(
        None, workdir, "--kv-cache-memory", str(64 << 20), "--max-num-seqs", "4"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(smollm2: RunningServer) -> openai.OpenAI:
    return smollm2.openai_client()


def ask(question: str, **extra: object) -> dict:
    return {
        "model": MODEL,
        "input": question,
        "max_output_tokens": 40,
        "temperature": 0,
        "include": LOGPROBS,
        "top_logprobs": 3,
        **extra,
    }


@pytest.mark.parametrize("question", QUESTIONS)
def test_entries_bytes_concatenate_to_exactly_the_output_text(client, question):
    response = client.responses.create(**ask(question))

    (message,) = response.output
    (part,) = message.content
    assert response.output_text == part.text and part.text
    assert b"".join(bytes(e.bytes) for e in part.logprobs) == part.text.encode()
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in part.logprobs)
    assert response.usage.output_tokens >= len(part.logprobs)


@pytest.mark.parametrize("question", QUESTIONS)
def test_a_stream_parsed_by_the_official_client_equals_the_whole_response(client, question):
    whole = client.responses.create(**ask(question))

    events = list(client.responses.create(**ask(question), stream=True))

    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(d.delta for d in deltas) == whole.output_text
    streamed = [(x.token, x.logprob) for d in deltas for x in d.logprobs]
    assert streamed == [(e.token, e.logprob) for e in whole.output[0].content[0].logprobs]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.output[0].content[0].logprobs == whole.output[0].content[0].logprobs
    assert final.response.usage == whole.usage


def test_the_stream_helper_accumulates_the_same_response(client):
    question = QUESTIONS[0]
    whole = client.responses.create(**ask(question))

    with client.responses.stream(**ask(question)) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()

    assert "".join(texts) == final.output_text == whole.output_text
    assert final.output[0].content[0].logprobs == whole.output[0].content[0].logprobs


def test_a_follow_up_continues_a_stored_response_and_it_can_be_retrieved(client):
    first = client.responses.create(**ask("My name is Ada. Say hello."))

    follow = client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=20
    )
    fetched = client.responses.retrieve(first.id)

    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert fetched.output_text == first.output_text and fetched.id == first.id


def test_a_bad_field_is_a_bad_request_the_client_raises(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="Hi", top_logprobs=2)

    assert raised.value.body["param"] == "top_logprobs"
