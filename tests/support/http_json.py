"""Whole JSON requests to an in-process app through Falcon's TestClient."""

from __future__ import annotations

from typing import Any

from falcon import testing


def post(target: Any, path: str, body: dict, *, status: int = 200) -> Any:
    """POSTs `body` to `path` of a TestClient (or of an app), asserts the response's status and
    returns its JSON."""
    client = target if isinstance(target, testing.TestClient) else testing.TestClient(target)
    result = client.simulate_post(path, json=body)
    assert result.status_code == status, result.text
    return result.json
