"""The official `openai` client against a real `helios serve` (gunicorn, ASGI) over HTTP."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import openai
import pytest

from tests.e2e.conftest import MAX_MODEL_LEN, MAX_NUM_SEQS, RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CLIENT_TIMEOUT_S = 30.0
GREEDY = {"temperature": 0.0}
PROMPT = "The quick brown fox jumps over the lazy dog"
MESSAGES = [{"role": "user", "content": "Name three primary colours."}]
CONCURRENT_PROMPTS = [
    f"Request number {i}: tell me about item {i * 7}" for i in range(MAX_NUM_SEQS)
]


def make_client(base_url: str, api_key: str = "x") -> openai.OpenAI:
    # No retries: a retried request would hide the very failure a test looks for.
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=CLIENT_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with make_client(server.base_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def tokenize(server: RunningServer, body: dict) -> list[int]:
    response = httpx2.post(f"{server.base_url}/tokenize", json=body, timeout=CLIENT_TIMEOUT_S)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def complete_text(client: openai.OpenAI, model: str, prompt, max_tokens: int = 12) -> str:
    response = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, extra_body={"ignore_eos": True}, **GREEDY
    )
    return response.choices[0].text


def test_health_is_200_once_the_model_is_loaded(server: RunningServer) -> None:
    response = httpx2.get(f"{server.base_url}/health", timeout=CLIENT_TIMEOUT_S)

    assert response.status_code == 200


def test_models_lists_the_model_path_as_its_name_with_its_context_length(
    client: openai.OpenAI, e2e_model_dir: Path
) -> None:
    models = client.models.list().data

    assert len(models) == 1
    assert models[0].id == str(e2e_model_dir)
    assert models[0].object == "model"
    assert models[0].owned_by == "helios"
    assert models[0].model_dump()["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_and_detokenize_round_trip_a_prompt(server: RunningServer) -> None:
    token_ids = tokenize(server, {"prompt": PROMPT, "add_special_tokens": False})

    response = httpx2.post(
        f"{server.base_url}/detokenize", json={"tokens": token_ids}, timeout=CLIENT_TIMEOUT_S
    )

    assert token_ids
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": PROMPT}


def test_completion_reports_text_length_finish_and_usage(
    client: openai.OpenAI, model: str, server: RunningServer
) -> None:
    response = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=10, extra_body={"ignore_eos": True}, **GREEDY
    )

    assert response.object == "text_completion"
    assert response.id.startswith("cmpl-")
    assert response.model == model
    assert [choice.index for choice in response.choices] == [0]
    assert response.choices[0].finish_reason == "length"
    assert response.choices[0].text
    prompt_tokens = len(tokenize(server, {"prompt": PROMPT}))
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.completion_tokens == 10
    assert response.usage.total_tokens == prompt_tokens + 10


def test_streamed_completion_concatenates_to_the_non_streamed_text(
    client: openai.OpenAI, model: str
) -> None:
    whole = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, extra_body={"ignore_eos": True}, **GREEDY
    )

    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
    )

    *text_chunks, usage_chunk = chunks
    assert {chunk.id for chunk in chunks} == {chunk.id for chunk in chunks[:1]}
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert all(len(chunk.choices) == 1 and chunk.usage is None for chunk in text_chunks)
    streamed = "".join(chunk.choices[0].text for chunk in text_chunks)
    assert streamed == whole.choices[0].text, "streamed text differs from the non-streamed text"
    assert [c.choices[0].finish_reason for c in text_chunks[:-1]] == [None] * (len(text_chunks) - 1)
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert usage_chunk.choices == []
    assert usage_chunk.usage.model_dump() == whole.usage.model_dump()


def test_chat_completion_reports_an_assistant_message_and_usage(
    client: openai.OpenAI, model: str, server: RunningServer
) -> None:
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=10, extra_body={"ignore_eos": True}, **GREEDY
    )

    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == model
    [choice] = response.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    prompt_tokens = len(tokenize(server, {"messages": MESSAGES}))
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.completion_tokens == 10
    assert response.usage.total_tokens == prompt_tokens + 10


def test_streamed_chat_starts_with_the_role_and_concatenates_to_the_non_streamed_reply(
    client: openai.OpenAI, model: str
) -> None:
    whole = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, extra_body={"ignore_eos": True}, **GREEDY
    )

    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
    )

    *delta_chunks, usage_chunk = chunks
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert delta_chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in delta_chunks)
    assert streamed == whole.choices[0].message.content, "streamed chat differs from non-streamed"
    assert delta_chunks[-1].choices[0].finish_reason == "length"
    assert usage_chunk.choices == []
    assert usage_chunk.usage.model_dump() == whole.usage.model_dump()


def test_n_two_returns_two_greedy_choices_equal_to_the_single_choice(
    client: openai.OpenAI, model: str
) -> None:
    single = complete_text(client, model, PROMPT)

    response = client.completions.create(
        model=model, prompt=PROMPT, n=2, max_tokens=12, extra_body={"ignore_eos": True}, **GREEDY
    )

    assert [choice.index for choice in response.choices] == [0, 1]
    assert [choice.text for choice in response.choices] == [single, single]
    assert response.usage.completion_tokens == 24


def test_chat_with_n_two_returns_two_indexed_choices(client: openai.OpenAI, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        n=2,
        max_tokens=8,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )

    assert [choice.index for choice in response.choices] == [0, 1]
    assert response.choices[0].message.content == response.choices[1].message.content
    assert response.usage.completion_tokens == 16


def test_a_batch_of_two_prompts_answers_each_as_if_sent_alone(
    client: openai.OpenAI, model: str
) -> None:
    prompts = ["Hello there", "Numbers 12345 and words"]
    alone = [complete_text(client, model, prompt) for prompt in prompts]

    response = client.completions.create(
        model=model, prompt=prompts, max_tokens=12, extra_body={"ignore_eos": True}, **GREEDY
    )

    assert [choice.index for choice in response.choices] == [0, 1]
    assert [choice.text for choice in response.choices] == alone
    assert response.usage.completion_tokens == 24


def test_token_id_prompts_answer_as_their_text(
    client: openai.OpenAI, model: str, server: RunningServer
) -> None:
    texts = ["Hello there", PROMPT]
    token_ids = [tokenize(server, {"prompt": text}) for text in texts]
    from_text = [complete_text(client, model, text) for text in texts]

    single = complete_text(client, model, token_ids[0])
    batch = client.completions.create(
        model=model, prompt=token_ids, max_tokens=12, extra_body={"ignore_eos": True}, **GREEDY
    )

    assert single == from_text[0]
    assert [choice.text for choice in batch.choices] == from_text
    assert batch.usage.prompt_tokens == sum(len(ids) for ids in token_ids)


def test_echo_with_zero_max_tokens_returns_the_prompt_alone(
    client: openai.OpenAI, model: str, server: RunningServer
) -> None:
    response = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True)

    [choice] = response.choices
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    assert response.usage.prompt_tokens == len(tokenize(server, {"prompt": PROMPT}))
    assert response.usage.completion_tokens == 0


def test_echo_with_generation_prefixes_the_prompt(client: openai.OpenAI, model: str) -> None:
    generated = complete_text(client, model, PROMPT, max_tokens=6)

    response = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=6,
        echo=True,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )

    assert response.choices[0].text == PROMPT + generated


def test_sixteen_concurrent_requests_each_match_their_sequential_result(
    client: openai.OpenAI, model: str
) -> None:
    sequential = [
        complete_text(client, model, prompt, max_tokens=16) for prompt in CONCURRENT_PROMPTS
    ]
    start_together = threading.Barrier(len(CONCURRENT_PROMPTS))

    def send(prompt: str) -> str:
        start_together.wait(timeout=CLIENT_TIMEOUT_S)
        return complete_text(client, model, prompt, max_tokens=16)

    with ThreadPoolExecutor(max_workers=len(CONCURRENT_PROMPTS)) as pool:
        concurrent = list(pool.map(send, CONCURRENT_PROMPTS))

    mismatched = [i for i, (a, b) in enumerate(zip(sequential, concurrent, strict=True)) if a != b]
    assert not mismatched, f"concurrent greedy text differs from sequential for {mismatched}"


def test_a_negative_max_tokens_is_a_bad_request_in_the_openai_envelope(
    client: openai.OpenAI, model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=-1)

    error = caught.value
    assert error.status_code == 400
    assert error.type == "BadRequestError"
    assert error.param == "max_tokens"
    assert error.code == "400"
    assert "max_tokens" in error.message
    assert set(error.response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_prompt_longer_than_the_context_is_a_bad_request(
    client: openai.OpenAI, model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=[5] * (MAX_MODEL_LEN + 8), max_tokens=4)

    assert caught.value.status_code == 400
    assert caught.value.type == "BadRequestError"


def test_an_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)

    error = caught.value
    assert error.status_code == 404
    assert error.type == "NotFoundError"
    assert error.param == "model"
    assert "no-such-model" in error.message


def test_a_client_closing_a_long_stream_leaves_the_server_answering(
    server: RunningServer, client: openai.OpenAI, model: str
) -> None:
    log_before = len(server.log())
    with make_client(server.base_url) as leaving:
        stream = leaving.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=200,
            stream=True,
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
        received = list(itertools.islice(stream, 3))
        stream.close()
    assert len(received) == 3
    assert all(chunk.choices[0].finish_reason is None for chunk in received)

    started = time.monotonic()
    answer = complete_text(client, model, "Hello there", max_tokens=4)
    elapsed = time.monotonic() - started
    health = httpx2.get(f"{server.base_url}/health", timeout=CLIENT_TIMEOUT_S)

    assert answer
    assert elapsed < 5.0, f"the next request took {elapsed:.1f} s after a client disconnected"
    assert health.status_code == 200
    since = server.log()[log_before:]
    assert "Traceback" not in since, f"the server logged an error after the disconnect:\n{since}"


def test_a_wrong_api_key_is_an_authentication_error(keyed_server: RunningServer) -> None:
    with (
        make_client(keyed_server.base_url, api_key="wrong") as wrong,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        wrong.models.list()

    assert caught.value.status_code == 401
    assert caught.value.type == "AuthenticationError"


def test_a_missing_api_key_is_refused_with_the_envelope(keyed_server: RunningServer) -> None:
    response = httpx2.post(
        f"{keyed_server.base_url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2},
        timeout=CLIENT_TIMEOUT_S,
    )

    assert response.status_code == 401
    assert response.json()["error"]["type"] == "AuthenticationError"


def test_the_right_api_key_is_served(keyed_server: RunningServer) -> None:
    with make_client(keyed_server.base_url, api_key="secret") as right:
        model = right.models.list().data[0].id
        response = right.completions.create(model=model, prompt=PROMPT, max_tokens=3, **GREEDY)

    assert response.usage.completion_tokens >= 1
    assert response.choices[0].finish_reason in {"length", "stop"}


KEYED_ROUTES = [
    ("POST", "/tokenize", {"prompt": PROMPT}),
    ("POST", "/detokenize", {"tokens": [5, 6, 7]}),
    ("GET", "/openapi.json", None),
    ("GET", "/v1/models", None),
]
WRONG_AUTHORIZATIONS = {
    "none": None,
    "wrong key": "Bearer wrong",
    "empty bearer": "Bearer ",
    "basic scheme": "Basic secret",
    "no scheme": "secret",
}


def call_keyed(
    server: RunningServer, method: str, path: str, body: dict | None, authorization: str | None
) -> tuple[int, dict]:
    """Status and JSON body; http.client, since httpx2 refuses the empty bearer's trailing space."""
    address = urllib.parse.urlsplit(server.base_url)
    connection = http.client.HTTPConnection(
        address.hostname, address.port, timeout=CLIENT_TIMEOUT_S
    )
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        connection.request(method, path, None if body is None else json.dumps(body), headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("authorization", WRONG_AUTHORIZATIONS.values(), ids=WRONG_AUTHORIZATIONS)
@pytest.mark.parametrize(("method", "path", "body"), KEYED_ROUTES)
def test_every_route_but_health_refuses_a_request_without_the_right_key(
    keyed_server: RunningServer,
    method: str,
    path: str,
    body: dict | None,
    authorization: str | None,
) -> None:
    status, answer = call_keyed(keyed_server, method, path, body, authorization)

    assert status == 401, answer
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["type"] == "AuthenticationError" and answer["error"]["code"] == 401


def test_tokenize_and_detokenize_answer_with_the_right_key(keyed_server: RunningServer) -> None:
    right = "Bearer secret"

    status, tokens = call_keyed(keyed_server, "POST", "/tokenize", {"prompt": PROMPT}, right)
    detokenized, text = call_keyed(
        keyed_server, "POST", "/detokenize", {"tokens": tokens["tokens"]}, right
    )

    assert status == 200 and tokens["count"] > 0
    assert detokenized == 200 and PROMPT in text["prompt"]


def test_health_needs_no_api_key(keyed_server: RunningServer) -> None:
    response = httpx2.get(f"{keyed_server.base_url}/health", timeout=CLIENT_TIMEOUT_S)

    assert response.status_code == 200
