"""The served app fuzzed against contracts/openapi.yaml, with a real tiny model behind it."""

from __future__ import annotations

import json
from typing import Any

import falcon.asgi
import falcon.inspect
import falcon.testing
import pytest
import schemathesis
import yaml
from hypothesis import settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from adapters.http.app import OPENAPI_PATH
from tests.support.sse import data_frames

# Schemathesis parametrizes at collection, so the contract is read then. It is the file itself,
# not the app's /openapi.json: `from_fixture` schemas break on pytest 9 (they set
# `node._nodeid`), and the first plain test below proves the app serves exactly this file.
schema = schemathesis.openapi.from_path(OPENAPI_PATH)
schema.config.generation.update(deterministic=True, database="none")
# Field names such as `tokens` look like secrets to Schemathesis; reports must show them.
schema.config.output.sanitization.update(enabled=False)

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
DONE = "[DONE]"
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
INT32_MAX = 2**31 - 1


def _user_first(body: Any) -> Any:
    """Opens a tool-first conversation with a user turn instead (test-only).

    The tiny model's chat template refuses a conversation that starts with a tool message (a
    documented 400), and generated conversations start that way so often that few chat requests
    would reach the model. Both roles are valid, so a request's validity does not change.
    """
    messages = body.get("messages") if isinstance(body, dict) else None
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and first.get("role") == "tool":
        return {**body, "messages": [{**first, "role": "user"}, *messages[1:]]}
    return body


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _choice_count(body: dict) -> int:
    """How many choices a valid, accepted generation request must answer with."""
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else 1
    return prompts * int(body.get("n") or 1)


def choices_follow_vllm_numbering(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """Choice index = prompt index * n + choice index; each choice finishes once; usage adds up.

    Streams must end with exactly one `[DONE]`, after the usage chunk when one was asked for.
    """
    is_generation = case.method == "POST" and case.path in GENERATION_PATHS
    if not is_generation or response.status_code != 200 or not isinstance(case.body, dict):
        return None
    expected = _choice_count(case.body)
    if "text/event-stream" not in response.headers.get("content-type", [""])[0]:
        body = response.json()
        assert [c["index"] for c in body["choices"]] == list(range(expected))
        assert all(c["finish_reason"] is not None for c in body["choices"]), "all choices end"
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        return True
    if response.stream_cut_short:
        return None
    payloads = data_frames(response.content.decode("utf-8"))
    assert payloads[-1] == DONE and payloads.count(DONE) == 1, "a stream ends with one [DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    if any("error" in chunk for chunk in chunks):
        assert "error" in chunks[-1], "an error frame is the last frame before [DONE]"
        return True
    assert len({chunk["id"] for chunk in chunks}) == 1, "every chunk repeats the response id"
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"] and _finishes(c)]
    assert sorted(finished) == list(range(expected)), "every choice finishes exactly once"
    options = case.body.get("stream_options") or {}
    if options.get("include_usage"):
        assert chunks[-1]["choices"] == [] and "usage" in chunks[-1], "usage chunk comes last"
    return True


def _finishes(chunk: dict) -> bool:
    return chunk["choices"][0]["finish_reason"] is not None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    choices_follow_vllm_numbering,
]


@schema.parametrize()
@settings(max_examples=40, deadline=None)
def test_every_operation_answers_as_the_contract_says(
    case: schemathesis.Case, contract_app: falcon.asgi.App
) -> None:
    case.body = _user_first(case.body)
    case.call_and_validate(app=contract_app, checks=CHECKS)


def test_the_contract_is_a_valid_openapi_3_1_document() -> None:
    schema.validate()


def test_openapi_json_is_the_yaml_contract_as_json(contract_app: falcon.asgi.App) -> None:
    result = falcon.testing.TestClient(contract_app).simulate_get("/openapi.json")

    assert result.status_code == 200
    assert result.json == yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))


def test_every_route_of_the_app_is_in_the_contract_and_nothing_else(
    contract_app: falcon.asgi.App,
) -> None:
    contract = yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))
    documented = {
        (path, method.upper())
        for path, item in contract["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }
    served = {
        (route.path, responder.method)
        for route in falcon.inspect.inspect_routes(contract_app)
        for responder in route.methods
        if not responder.internal
    }

    assert served == documented


KEYED_BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [5]},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
}
PATH_PARAMETERS = {"/v1/responses/{response_id}": {"response_id": "resp_unknown"}}


@pytest.mark.parametrize(
    ("path", "method"),
    [
        (path, method.upper())
        for path, item in yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))["paths"].items()
        for method in item
        if method in HTTP_METHODS and path != "/health"
    ],
)
def test_every_route_but_health_without_the_api_key_gets_the_documented_401(
    secured_app: falcon.asgi.App, path: str, method: str
) -> None:
    body = KEYED_BODIES.get(path)
    operation = schema[path][method]
    parameters = PATH_PARAMETERS.get(path, {})
    case = (
        operation.Case(body=body, path_parameters=parameters)
        if body
        else operation.Case(path_parameters=parameters)
    )

    response = case.call_and_validate(app=secured_app, checks=CHECKS)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401


def test_health_is_the_one_route_that_needs_no_api_key(secured_app: falcon.asgi.App) -> None:
    result = falcon.testing.TestClient(secured_app).simulate_get("/health")

    assert result.status_code == 200


def test_detokenize_reads_back_what_tokenize_wrote(contract_app: falcon.asgi.App) -> None:
    client = falcon.testing.TestClient(contract_app)
    text = "the quick brown fox"

    tokens = client.simulate_post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    decoded = client.simulate_post("/detokenize", json={"tokens": tokens.json["tokens"]})

    assert tokens.json["count"] == len(tokens.json["tokens"]) > 0
    assert decoded.status_code == 200
    assert decoded.json == {"prompt": text}


def test_a_top_k_at_the_int32_maximum_is_served_and_one_past_it_is_a_bad_request(
    contract_app: falcon.asgi.App,
) -> None:
    client = falcon.testing.TestClient(contract_app)
    body = {"prompt": "hi", "max_tokens": 2}

    served = client.simulate_post("/v1/completions", json={**body, "top_k": INT32_MAX})
    refused = client.simulate_post("/v1/completions", json={**body, "top_k": INT32_MAX + 1})

    assert served.status_code == 200
    assert refused.status_code == 400
    assert refused.json["error"]["param"] == "top_k"


def test_detokenize_refuses_null_tokens(contract_app: falcon.asgi.App) -> None:
    client = falcon.testing.TestClient(contract_app)

    result = client.simulate_post("/detokenize", json={"tokens": None})

    assert result.status_code == 400
    assert result.json["error"]["param"] == "tokens"


def test_a_deeply_nested_body_is_a_bad_request(contract_app: falcon.asgi.App) -> None:
    depth = 100_000
    body = b"[" * depth + b"]" * depth

    result = falcon.testing.TestClient(contract_app).simulate_post(
        "/v1/completions", body=body, headers={"Content-Type": "application/json"}
    )

    assert result.status_code == 400


# Regressions found while fuzzing, in the field readers that adapters/http/requests replaced.


@pytest.mark.parametrize("n", [0, 17])
def test_a_completion_that_only_echoes_still_refuses_n_outside_1_to_16(
    contract_app: falcon.asgi.App, n: int
) -> None:
    body = {"prompt": "hi", "echo": True, "max_tokens": 0, "n": n}

    result = falcon.testing.TestClient(contract_app).simulate_post("/v1/completions", json=body)

    assert result.status_code == 400
    assert result.json["error"]["param"] == "n"


def test_integral_floats_are_read_as_integers_as_json_schema_and_vllm_read_them(
    contract_app: falcon.asgi.App,
) -> None:
    body = {"prompt": [5.0, 6], "max_tokens": 2.0, "top_k": 3.0, "seed": 7.0, "n": 2.0}

    result = falcon.testing.TestClient(contract_app).simulate_post("/v1/completions", json=body)

    assert result.status_code == 200
    assert [choice["index"] for choice in result.json["choices"]] == [0, 1]
    assert result.json["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 10**400), ("logit_bias", {"5": 10**400}), ("logit_bias", {"5": -(10**400)})],
)
def test_a_number_past_float_range_is_a_bad_request_not_a_crash(
    contract_app: falcon.asgi.App, field: str, value: object
) -> None:
    body = {"prompt": "hi", "max_tokens": 1, field: value}

    result = falcon.testing.TestClient(contract_app).simulate_post("/v1/completions", json=body)

    assert result.status_code == 400
    assert result.json["error"]["param"] == field


@pytest.mark.parametrize("key", [" 5", "+5", "1_0", "\u0665", "-1", "5" * 5000])
def test_logit_bias_keys_must_be_plain_decimal_token_ids(
    contract_app: falcon.asgi.App, key: str
) -> None:
    body = {"prompt": "hi", "max_tokens": 1, "logit_bias": {key: 1}}

    result = falcon.testing.TestClient(contract_app).simulate_post("/v1/completions", json=body)

    assert result.status_code == 400
    assert result.json["error"]["param"] == "logit_bias"


@pytest.mark.parametrize("max_tokens", ["a", 0, -3])
def test_chat_checks_max_tokens_even_when_max_completion_tokens_wins(
    contract_app: falcon.asgi.App, max_tokens: object
) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 2,
        "max_tokens": max_tokens,
    }

    result = falcon.testing.TestClient(contract_app).simulate_post(
        "/v1/chat/completions", json=body
    )

    assert result.status_code == 400
    assert result.json["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "logprobs": False}),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "top_logprobs": False}),
    ],
)
def test_a_logprob_field_is_refused_unless_it_plainly_asks_for_none(
    contract_app: falcon.asgi.App, path: str, body: dict
) -> None:
    result = falcon.testing.TestClient(contract_app).simulate_post(path, json=body)

    assert result.status_code == 400
    assert result.json["error"]["param"] in ("logprobs", "top_logprobs")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a\ud800"}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", "\udfff"]}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "stop": "\ud800"}, "stop"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
            "messages",
        ),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ],
)
def test_text_with_a_lone_surrogate_escape_is_a_bad_request_not_a_crash(
    contract_app: falcon.asgi.App, path: str, body: dict, param: str
) -> None:
    # JSON may spell lone surrogates (`"\ud800"`); the tokenizer raised TypeError on them (a 500).
    # json.dumps escapes them as JSON allows; the test client's own encoder cannot encode them.
    result = falcon.testing.TestClient(contract_app).simulate_post(
        path, body=json.dumps(body), headers={"Content-Type": "application/json"}
    )

    assert result.status_code == 400
    assert result.json["error"]["param"] == param
