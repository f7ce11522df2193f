"""What a served core declares decides which logprob requests it takes (exported cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from falcon import testing

from adapters.cli.asgi import load_served_model
from adapters.cli.serve_config import ServeConfig
from adapters.core.export import CoreSizes, export_core
from adapters.gpu.factory import RunnerSettings
from adapters.http.app import create_app
from adapters.http.serving import ModelHolder

pytestmark = pytest.mark.model

RUNNER = RunnerSettings(
    device="cpu", max_num_seqs=8, max_model_len=128, kv_cache_bytes=8 << 20, block_size=8
)


def serve_core(core_dir) -> Iterator[testing.TestClient]:
    served = load_served_model(ServeConfig(model=str(core_dir), runner=RUNNER))
    try:
        yield testing.TestClient(create_app(ModelHolder(served=served)))
    finally:
        served.stop()


@pytest.fixture(scope="module")
def no_logprobs(http_model_dir, tmp_path_factory):
    core = tmp_path_factory.mktemp("cores") / "none"
    export_core(
        str(http_model_dir), core, logprobs="none", progress=False, sizes=CoreSizes(max_num_seqs=8)
    )
    yield from serve_core(core)


@pytest.fixture(scope="module")
def natural(http_model_dir, tmp_path_factory):
    core = tmp_path_factory.mktemp("cores") / "natural"
    export_core(
        str(http_model_dir),
        core,
        logprobs="natural",
        top_k=5,
        progress=False,
        sizes=CoreSizes(max_num_seqs=8),
    )
    yield from serve_core(core)


def test_a_core_without_logprob_buffers_serves_and_says_allow_logprobs_false(no_logprobs):
    models = no_logprobs.simulate_get("/v1/models").json
    plain = no_logprobs.simulate_post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})

    assert models["data"][0]["permission"][0]["allow_logprobs"] is False
    assert plain.status_code == 200 and plain.json["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "hi", "logprobs": 0}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 1, "logprob_token_ids": [3]}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
            "logprobs",
        ),
    ],
)
def test_every_logprob_request_on_a_k0_core_is_a_400_before_admission(
    no_logprobs, path, body, param
):
    result = no_logprobs.simulate_post(path, json=body)

    assert result.status_code == 400
    assert result.json["error"]["param"] == param
    assert "allow_logprobs is false" in result.json["error"]["message"]


def test_a_natural_core_serves_up_to_its_k_alternatives(natural):
    result = natural.simulate_post(
        "/v1/completions",
        json={
            "prompt": "hi",
            "max_tokens": 3,
            "logprobs": 5,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
        },
    )

    assert result.status_code == 200
    tops = result.json["choices"][0]["logprobs"]["top_logprobs"]
    assert len(tops) == 3 and all(5 <= len(top) <= 6 for top in tops)
    assert natural.simulate_get("/v1/models").json["data"][0]["permission"][0]["allow_logprobs"]


def test_a_natural_core_refuses_more_than_k_and_any_selected_ids(natural):
    too_many = natural.simulate_post("/v1/completions", json={"prompt": "hi", "logprobs": 6})
    selected = natural.simulate_post(
        "/v1/completions", json={"prompt": "hi", "logprobs": 1, "logprob_token_ids": [3, 4]}
    )

    assert too_many.status_code == 400 and too_many.json["error"]["param"] == "logprobs"
    assert "max allowed: 5" in too_many.json["error"]["message"]
    assert selected.status_code == 400
    assert selected.json["error"]["param"] == "logprob_token_ids"


@pytest.fixture(scope="module")
def scoring_core(http_model_dir, tmp_path_factory):
    core = tmp_path_factory.mktemp("cores") / "scoring"
    export_core(
        str(http_model_dir),
        core,
        progress=False,
        sizes=CoreSizes(max_num_seqs=8, prompt_chunk_limit=64),
    )
    yield from serve_core(core)


@pytest.fixture(scope="module")
def full_without_scoring(http_model_dir, tmp_path_factory):
    core = tmp_path_factory.mktemp("cores") / "full"
    export_core(str(http_model_dir), core, progress=False, sizes=CoreSizes(max_num_seqs=8))
    yield from serve_core(core)


def test_a_core_exported_with_prompt_scoring_serves_echo_logprobs(scoring_core):
    prompt = list(range(3, 100))  # longer than the core's chunk limit of 64 rows
    result = scoring_core.simulate_post(
        "/v1/completions",
        json={"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1},
    )

    assert result.status_code == 200, result.text
    logprobs = result.json["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) + 1
    assert logprobs["token_logprobs"][0] is None
    assert all(value <= 0 for value in logprobs["token_logprobs"][1:])


def test_a_full_core_without_scoring_answers_prompt_logprob_requests_with_400(
    full_without_scoring,
):
    result = full_without_scoring.simulate_post(
        "/v1/completions", json={"prompt": "hi", "prompt_logprobs": 1}
    )
    plain = full_without_scoring.simulate_post(
        "/v1/completions", json={"prompt": "hi", "logprobs": 2, "max_tokens": 2}
    )

    assert result.status_code == 400 and result.json["error"]["param"] == "prompt_logprobs"
    assert plain.status_code == 200
