"""Text offsets on the wire under split and invalid UTF-8 (contracts/api.md, "Text offsets").

A tiny model with random weights, nudged towards single bytes of 0x80 and up, writes split,
truncated and invalid UTF-8; every offset, entry and `bytes` list must follow the rule that the
reference in `tests/support/text_offsets.py` computes from the token bytes alone.
"""

from __future__ import annotations

import pytest
from falcon import testing

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from tests.integration.http.conftest import serve_tiny
from tests.support.asgi_stream import stream_post
from tests.support.http_json import post
from tests.support.sse import json_frames
from tests.support.text_offsets import decoded, offsets_by_rule, slices_match_bytes
from tests.support.tiny_serving import build_tiny_model_dir

pytestmark = pytest.mark.model

SEEDS = range(4)
EMOJI = "\U0001f600".encode()


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def served_model(request, http_model_dir, tmp_path_factory):
    if request.param == "byte_level":
        model_dir = http_model_dir
    else:
        model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("fallback"), byte_fallback=True)
    served = serve_tiny(model_dir, prompt_logprobs=True)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def app(served_model: ServedModel):
    return create_app(ModelHolder(served=served_model))


@pytest.fixture(scope="module")
def api(app) -> testing.TestClient:
    return testing.TestClient(app)


def _byte_ids(served: ServedModel) -> dict[int, int]:
    """The token ID of each single byte of 0x80 and up."""
    tokenizer = served.tokenizer
    found: dict[int, int] = {}
    for token_id in range(tokenizer.vocab_size):
        piece = tokenizer.token_bytes(token_id)
        if len(piece) == 1 and piece[0] >= 0x80 and token_id not in tokenizer.special_token_ids:
            found.setdefault(piece[0], token_id)
    return found


def _sampling(served: ServedModel, seed: int) -> dict:
    bias = {str(token_id): 4.0 for token_id in _byte_ids(served).values()}
    return {"max_tokens": 40, "temperature": 1.0, "seed": seed, "logit_bias": bias}


def _pieces(served: ServedModel, names: list[str]) -> list[bytes]:
    """The bytes each `token_id:<id>` entry adds to the text (none for a skipped special)."""
    tokenizer = served.tokenizer
    ids = [int(name.removeprefix("token_id:")) for name in names]
    return [b"" if i in tokenizer.special_token_ids else tokenizer.token_bytes(i) for i in ids]


def _check(text: str, pieces: list[bytes], offsets: list[int]) -> None:
    assert text == decoded(b"".join(pieces))
    assert offsets == offsets_by_rule(pieces)
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    assert slices_match_bytes(pieces, offsets)


def test_completion_offsets_whole_and_streamed_index_the_text(api, app, served_model):
    split = replaced = 0
    for seed in SEEDS:
        body = {
            "prompt": "the quick",
            **_sampling(served_model, seed),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        choice = post(api, "/v1/completions", body)["choices"][0]
        logprobs = choice["logprobs"]
        pieces = _pieces(served_model, logprobs["tokens"])
        _check(choice["text"], pieces, logprobs["text_offset"])

        status, raw = stream_post(app, "/v1/completions", json={**body, "stream": True})
        assert status == 200
        chunks = [f["choices"][0] for f in json_frames(raw) if f.get("choices")]
        assert "".join(c["text"] for c in chunks) == choice["text"]
        streamed = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        assert streamed == logprobs["text_offset"]

        offsets = logprobs["text_offset"]
        split += len(offsets) - len(set(offsets))
        replaced += choice["text"].count("\ufffd")
    # The sample holds characters split over tokens and invalid bytes, or it proves nothing.
    assert split and replaced


def test_echoed_prompt_and_completion_offsets_index_the_echoed_text(api, served_model):
    tokenizer = served_model.tokenizer
    ids = _byte_ids(served_model)
    literal = tokenizer.encode("a\ufffd", add_special_tokens=False)
    # An emoji split over four tokens, one cut short, a lone continuation byte, a truncated
    # 3-byte sequence and a literal U+FFFD.
    prompt = [ids[b] for b in EMOJI] + [ids[EMOJI[0]], ids[EMOJI[1]], ids[0x80]]
    prompt += [ids[0xE2], ids[0x82], *literal, ids[0xC3]]
    for seed in SEEDS:
        body = {
            "prompt": prompt,
            **_sampling(served_model, seed),
            "max_tokens": 12,
            "echo": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        choice = post(api, "/v1/completions", body)["choices"][0]
        logprobs = choice["logprobs"]
        names, offsets = logprobs["tokens"], logprobs["text_offset"]
        prompt_pieces = _pieces(served_model, names[: len(prompt)])
        prompt_text = decoded(b"".join(prompt_pieces))
        assert choice["text"].startswith(prompt_text)
        _check(prompt_text, prompt_pieces, offsets[: len(prompt)])
        generated = _pieces(served_model, names[len(prompt) :])
        end = len(choice["text"])
        if choice["finish_reason"] == "stop":  # the terminating EOS points at the end
            assert offsets[-1] == end
            generated, offsets = generated[:-1], offsets[:-1]
        _check(
            choice["text"][len(prompt_text) :],
            generated,
            [o - len(prompt_text) for o in offsets[len(prompt) :]],
        )


def test_chat_bytes_concatenate_to_the_output_bytes(api, app, served_model):
    for seed in SEEDS:
        body = {
            "messages": [{"role": "user", "content": "the quick"}],
            **_sampling(served_model, seed),
            "logprobs": True,
        }
        choice = post(api, "/v1/chat/completions", body)["choices"][0]
        content = choice["logprobs"]["content"]
        data = b"".join(bytes(entry["bytes"]) for entry in content)
        assert decoded(data) == choice["message"]["content"]
        for entry in content:
            assert entry["token"] == decoded(bytes(entry["bytes"]))

        status, raw = stream_post(app, "/v1/chat/completions", json={**body, "stream": True})
        assert status == 200
        chunks = [f["choices"][0] for f in json_frames(raw) if f.get("choices")]
        streamed = [e for c in chunks if c.get("logprobs") for e in c["logprobs"]["content"]]
        assert streamed == content


def test_responses_output_text_entries_spell_the_output_text(api, served_model):
    for seed in SEEDS:
        sampling = _sampling(served_model, seed)
        body = {
            "input": "the quick",
            "max_output_tokens": sampling["max_tokens"],
            "temperature": 1.0,
            "seed": seed,
            "logit_bias": sampling["logit_bias"],
            "include": ["message.output_text.logprobs"],
        }
        result = api.simulate_post("/v1/responses", json=body)
        assert result.status_code == 200, result.text
        parts = [p for item in result.json["output"] for p in item.get("content", [])]
        part = next(p for p in parts if p["type"] == "output_text")
        data = b"".join(bytes(entry["bytes"]) for entry in part["logprobs"])
        assert decoded(data) == part["text"]
