"""`/v1/models` reports `max_model_len` as vLLM does: the config's positions, or a smaller
`--max-model-len`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder
from tests.integration.http.conftest import serve_tiny

pytestmark = pytest.mark.model


@pytest.mark.parametrize("max_model_len", [None, 200])
def test_the_model_card_reports_the_configs_positions_or_the_smaller_flag(
    http_model_dir: Path, max_model_len: int | None
) -> None:
    positions = json.loads((http_model_dir / "config.json").read_text())["max_position_embeddings"]
    served = serve_tiny(http_model_dir, max_model_len=max_model_len)
    try:
        client = testing.TestClient(create_app(ModelHolder(served=served)))
        card = client.simulate_get("/v1/models").json["data"][0]
        counted = client.simulate_post("/tokenize", json={"prompt": "hi"}).json
    finally:
        served.stop()
    expected = positions if max_model_len is None else max_model_len
    assert card["max_model_len"] == counted["max_model_len"] == expected
