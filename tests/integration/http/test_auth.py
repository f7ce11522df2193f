"""With `--api-key`, every route but `/health` wants `Authorization: Bearer KEY`."""

from __future__ import annotations

import pytest
import yaml

from adapters.http.app import OPENAPI_PATH
from tests.integration.http.test_errors import assert_error

KEY = "sk-1"  # the key `keyed_client` is built with
# Every way of not presenting the key that a client might try.
WRONG_AUTHORIZATIONS = {
    "none": None,
    "wrong key": "Bearer nope",
    "empty bearer": "Bearer ",
    "basic scheme": f"Basic {KEY}",
    "no scheme": KEY,
}
OPEN_ROUTE = ("GET", "/health")
BODIES = {
    "/v1/completions": {"prompt": "x", "max_tokens": 2, "temperature": 0},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        "temperature": 0,
    },
    "/tokenize": {"prompt": "hello there"},
    "/detokenize": {"tokens": [5, 6, 7]},
    "/v1/responses": {"input": "x", "max_output_tokens": 2, "temperature": 0},
}
# Fields that differ between two answers to the same request, at any depth.
PER_RESPONSE = ("id", "created", "created_at")
STORED = "/v1/responses/{response_id}"


def _contract_routes() -> list[tuple[str, str]]:
    # The contract lists every route the app serves (tests/contract/test_openapi.py checks it),
    # so a route added there, such as /metrics, is covered here without a change.
    paths = yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))["paths"]
    return [(method.upper(), path) for path, item in paths.items() for method in item]


GUARDED_ROUTES = [route for route in _contract_routes() if route != OPEN_ROUTE]


def _call(client, method: str, path: str, authorization: str | None):
    headers = {} if authorization is None else {"Authorization": authorization}
    if path == STORED:
        # A response this client stored, so that reading it back can succeed.
        created = client.simulate_post(
            "/v1/responses", json=BODIES["/v1/responses"], headers=headers
        )
        stored_id = created.json["id"] if created.status_code == 200 else "resp_unknown"
        path = path.format(response_id=stored_id)
    return client.simulate_request(method, path, json=BODIES.get(path), headers=headers)


def _without_ids(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in PER_RESPONSE}
    if isinstance(value, list):
        return [_without_ids(item) for item in value]
    return value


def _comparable(result) -> object:
    if not result.headers.get("content-type", "").startswith("application/json"):
        # Two apps' metrics differ in their values, not in which families they declare.
        return sorted(line for line in result.text.splitlines() if line.startswith("# TYPE"))
    return _without_ids(result.json)


def test_the_contract_lists_the_routes_this_test_guards():
    assert OPEN_ROUTE in _contract_routes()
    assert {"/tokenize", "/detokenize", "/openapi.json", "/v1/models"} <= {
        path for _, path in GUARDED_ROUTES
    }


@pytest.mark.model
@pytest.mark.parametrize("authorization", WRONG_AUTHORIZATIONS.values(), ids=WRONG_AUTHORIZATIONS)
@pytest.mark.parametrize(("method", "path"), GUARDED_ROUTES)
def test_a_guarded_route_without_the_right_key_is_a_401(keyed_client, method, path, authorization):
    result = _call(keyed_client, method, path, authorization)

    error = assert_error(result, 401)
    assert error["type"] == "AuthenticationError"


@pytest.mark.model
@pytest.mark.parametrize(("method", "path"), GUARDED_ROUTES)
def test_a_guarded_route_with_the_right_key_answers_as_an_open_server_does(
    client, keyed_client, method, path
):
    keyed = _call(keyed_client, method, path, f"Bearer {KEY}")
    open_ = _call(client, method, path, None)

    assert keyed.status_code == 200, keyed.text
    assert _comparable(keyed) == _comparable(open_)


@pytest.mark.model
@pytest.mark.parametrize("authorization", WRONG_AUTHORIZATIONS.values(), ids=WRONG_AUTHORIZATIONS)
def test_health_answers_whatever_the_authorization(keyed_client, authorization):
    assert _call(keyed_client, *OPEN_ROUTE, authorization).status_code == 200


@pytest.mark.model
def test_an_unknown_route_is_a_401_without_the_key_and_a_404_with_it(keyed_client):
    assert_error(_call(keyed_client, "GET", "/v1/nothing", None), 401)
    assert_error(_call(keyed_client, "GET", "/nothing", "Bearer nope"), 401)

    assert_error(_call(keyed_client, "GET", "/nothing", f"Bearer {KEY}"), 404)
