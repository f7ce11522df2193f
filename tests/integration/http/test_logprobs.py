"""Generation logprobs on the wire, over a full core (K = 20 plus selected IDs) of a tiny model."""

from __future__ import annotations

import json
import math

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import serve_tiny
from tests.support.asgi_stream import stream_post
from tests.support.sse import data_frames, json_frames

pytestmark = pytest.mark.model

LENGTH = {"ignore_eos": True}


@pytest.fixture(scope="module", params=["reference", "triton"])
def backend_served(request, http_model_dir):
    """Every test here runs against both reducers behind the same port."""
    served = serve_tiny(http_model_dir, logprobs_backend=request.param)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def app(backend_served):
    return create_app(ModelHolder(served=backend_served))


@pytest.fixture(scope="module")
def client(app) -> testing.TestClient:
    return testing.TestClient(app)


def completion(client, **body):
    result = client.simulate_post("/v1/completions", json={"prompt": "Hello there", **body})
    assert result.status_code == 200, result.text
    return result.json


def chat(client, **body):
    result = client.simulate_post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello!"}], **body}
    )
    assert result.status_code == 200, result.text
    return result.json


def test_completion_logprobs_equal_float64_log_softmax_of_transformers_logits(
    client, served, reference
):
    body = completion(
        client,
        max_tokens=8,
        logprobs=5,
        temperature=0.8,
        seed=3,
        return_tokens_as_token_ids=True,
        **LENGTH,
    )

    logprobs = body["choices"][0]["logprobs"]
    prompt = served.tokenizer.encode("Hello there")
    generated = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    rows = reference(prompt + generated)
    for index, token_id in enumerate(generated):
        expected = rows[len(prompt) - 1 + index]
        assert math.isclose(logprobs["token_logprobs"][index], expected[token_id], abs_tol=1e-4)
        top = logprobs["top_logprobs"][index]
        natural = sorted(range(expected.numel()), key=lambda t: (-expected[t].item(), t))[:5]
        keys = [f"token_id:{t}" for t in natural]
        assert list(top) == [f"token_id:{token_id}"] + [k for k in keys if k != list(top)[0]]
        for token in natural:
            assert math.isclose(top[f"token_id:{token}"], expected[token].item(), abs_tol=1e-4)


def test_completion_logprobs_have_one_entry_per_token_with_the_chosen_token_first(client):
    body = completion(client, max_tokens=12, logprobs=3, seed=5, **LENGTH)

    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    count = body["usage"]["completion_tokens"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == count
    assert len(logprobs["top_logprobs"]) == len(logprobs["text_offset"]) == count
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert next(iter(top)) == token and top[token] == value
        assert 1 <= len(top) <= 4
        assert all(math.isfinite(v) and v <= 0 for v in top.values())
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] <= len(choice["text"])


def test_chat_logprobs_bytes_concatenate_to_the_generated_bytes(client, served):
    body = chat(client, max_tokens=10, logprobs=True, top_logprobs=3, seed=9, **LENGTH)

    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    raw = b"".join(bytes(entry["bytes"]) for entry in content)
    assert raw.decode("utf-8", errors="replace") == body["choices"][0]["message"]["content"]
    for entry in content:
        tops = entry["top_logprobs"]
        assert len(tops) == 3
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert entry["logprob"] <= tops[0]["logprob"]


def test_logprob_token_ids_are_reported_in_caller_order_on_both_endpoints(
    client, served, reference
):
    ids = [17, 3, 250, 9]

    body = completion(
        client,
        max_tokens=4,
        logprobs=0,
        logprob_token_ids=ids,
        temperature=0,
        return_tokens_as_token_ids=True,
        **LENGTH,
    )
    chat_body = chat(
        client, max_tokens=3, logprobs=True, logprob_token_ids=ids, temperature=0, **LENGTH
    )

    logprobs = body["choices"][0]["logprobs"]
    prompt = served.tokenizer.encode("Hello there")
    generated = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    rows = reference(prompt + generated)
    for index, top in enumerate(logprobs["top_logprobs"]):
        order = [generated[index], *ids]  # the chosen token first, then the caller's order
        assert list(top) == list(dict.fromkeys(f"token_id:{t}" for t in order))
        for token_id in ids:
            reported = top[f"token_id:{token_id}"]
            assert math.isclose(reported, rows[len(prompt) - 1 + index][token_id], abs_tol=1e-4)
    for entry in chat_body["choices"][0]["logprobs"]["content"]:
        assert [t["bytes"] for t in entry["top_logprobs"]] == [
            list(served.tokenizer.token_bytes(t)) for t in ids
        ]


def test_streamed_logprobs_concatenate_to_the_non_streamed_result(client, app):
    request = {
        "prompt": "Hello there",
        "max_tokens": 9,
        "logprobs": 2,
        "seed": 4,
        "n": 2,
        "stop": ["e"],
        **LENGTH,
    }
    whole = client.simulate_post("/v1/completions", json=request).json

    _, text = stream_post(app, "/v1/completions", json={**request, "stream": True})

    merged = {
        0: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []},
        1: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []},
    }
    for chunk in json_frames(text):
        (choice,) = chunk["choices"]
        if choice["logprobs"] is not None:
            for key, values in choice["logprobs"].items():
                merged[choice["index"]][key] += values
    assert [merged[0], merged[1]] == [c["logprobs"] for c in whole["choices"]]


def test_chat_stream_logprobs_concatenate_to_the_non_streamed_result(client, app):
    request = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 7,
        "logprobs": True,
        "top_logprobs": 2,
        "seed": 8,
        **LENGTH,
    }
    whole = client.simulate_post("/v1/chat/completions", json=request).json

    _, text = stream_post(app, "/v1/chat/completions", json={**request, "stream": True})

    content = []
    for chunk in json_frames(text):
        logprobs = chunk["choices"][0]["logprobs"]
        if logprobs is not None:
            content += logprobs["content"]
    assert content == whole["choices"][0]["logprobs"]["content"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Hello there", "logprobs": 20}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 20},
        ),
    ],
)
def test_bodies_and_frames_are_compact_json_with_json_dumps_float_text(client, app, path, body):
    request = {**body, "max_tokens": 6, "seed": 3, **LENGTH}

    def written(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    whole = client.simulate_post(path, json=request)
    status, text = stream_post(app, path, json={**request, "stream": True})
    assert (whole.status_code, status) == (200, 200), whole.text

    # Parsing keeps key order and each float's value; writing it back with json.dumps gives
    # the bytes only if every float was written as json.dumps writes it.
    assert whole.text == written(whole.json)
    frames = data_frames(text)
    assert frames[-1] == "[DONE]"
    assert all(frame == written(json.loads(frame)) for frame in frames[:-1])


def test_requesting_logprobs_does_not_change_the_sampled_tokens(client):
    request = {"max_tokens": 12, "seed": 21, "temperature": 1.0, "top_k": 5, **LENGTH}

    plain = completion(client, **request)["choices"][0]["text"]
    with_logprobs = completion(client, logprobs=20, **request)["choices"][0]["text"]

    assert plain == with_logprobs


def test_reported_values_ignore_temperature_penalties_and_filters(client):
    base = {"max_tokens": 6, "logprobs": 3, "temperature": 0, **LENGTH}

    raw = completion(client, **base)["choices"][0]["logprobs"]
    processed = completion(client, **{**base, "top_k": 2, "min_p": 0.2, "logit_bias": {"5": -3.0}})[
        "choices"
    ][0]["logprobs"]

    assert processed["token_logprobs"][0] == raw["token_logprobs"][0]
    assert processed["top_logprobs"][0] == raw["top_logprobs"][0]


def test_a_terminating_stop_token_has_no_entry(client):
    probe = completion(
        client, max_tokens=8, temperature=0, return_tokens_as_token_ids=True, logprobs=0, **LENGTH
    )["choices"][0]["logprobs"]["tokens"]
    greedy = [int(token.removeprefix("token_id:")) for token in probe]
    # The first greedy token after the first one that did not occur before it: as a stop token
    # it ends the choice exactly there.
    stop_at = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])
    stop_id = greedy[stop_at]

    body = completion(
        client, max_tokens=10, temperature=0, logprobs=1, stop_token_ids=[stop_id], **LENGTH
    )

    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id
    assert body["usage"]["completion_tokens"] == stop_at + 1
    assert len(choice["logprobs"]["tokens"]) == stop_at


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": "3"}, "logprobs"),
        ({"logprobs": 1, "logprob_token_ids": list(range(129))}, "logprob_token_ids"),
        ({"logprobs": 1, "logprob_token_ids": [3, 3]}, "logprob_token_ids"),
        ({"logprobs": 1, "logprob_token_ids": [10**6]}, "logprob_token_ids"),
        ({"logprobs": 1, "logprob_token_ids": []}, "logprob_token_ids"),
        ({"logprob_token_ids": [3]}, "logprob_token_ids"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"logprobs": 1, "echo": True}, "prompt_logprobs"),
    ],
)
def test_bad_completion_logprob_requests_are_a_400(client, body, param):
    result = client.simulate_post("/v1/completions", json={"prompt": "x", **body})

    assert result.status_code == 400, result.text
    assert result.json["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprob_token_ids": [1]}, "logprob_token_ids"),
    ],
)
def test_bad_chat_logprob_requests_are_a_400(client, body, param):
    result = client.simulate_post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **body}
    )

    assert result.status_code == 400, result.text
    assert result.json["error"]["param"] == param


def test_models_advertise_allow_logprobs_on_a_full_core(client):
    assert client.simulate_get("/v1/models").json["data"][0]["permission"][0]["allow_logprobs"]


def test_chat_alternatives_ignore_temperature_penalties_top_p_and_bias(client):
    base = {"max_tokens": 1, "logprobs": True, "top_logprobs": 5, **LENGTH}

    raw = chat(client, temperature=0, **base)["choices"][0]["logprobs"]["content"][0]
    processed = chat(
        client,
        temperature=1.7,
        top_p=0.3,
        seed=2,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        repetition_penalty=1.8,
        logit_bias={"7": 50},
        **base,
    )["choices"][0]["logprobs"]["content"][0]

    assert processed["top_logprobs"] == raw["top_logprobs"]
