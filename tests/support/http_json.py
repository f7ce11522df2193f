"""Whole JSON requests: to an in-process app through Falcon's TestClient, or to a server."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from falcon import testing


def post(target: Any, path: str, body: dict, *, status: int = 200) -> Any:
    """POSTs `body` to `path` of a TestClient (or of an app), asserts the response's status and
    returns its JSON."""
    client = target if isinstance(target, testing.TestClient) else testing.TestClient(target)
    result = client.simulate_post(path, json=body)
    assert result.status_code == status, result.text
    return result.json


def post_url(base_url: str, path: str, body: dict, timeout: float = 60) -> Any:
    """POSTs `body` to a running server and returns its JSON answer (an HTTP error raises)."""
    request = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())
