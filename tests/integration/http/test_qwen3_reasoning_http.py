"""A tiny Qwen3 checkpoint whose tokenizer carries `<think>` and `</think>` served with
`--reasoning-parser qwen3`: thinking and content split, content entries are the raw values."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.http.app import create_app
from adapters.http.serving import ModelHolder, ServedModel
from adapters.tokenizer.hf import HfTokenizer
from tests.integration.http.conftest import parser_app, serve_tiny
from tests.support import family_checks as checks
from tests.support import http_json
from tests.support.tiny_models import build_tiny_qwen3
from tests.support.tiny_serving import TINY_VOCAB
from tests.support.tokenizers import build_marker_bpe

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
# Steered with a one-choice grammar; the logprobs stay the model's raw values.
THOUGHT = "<think>the fox</think>\n\nover the dog"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("qwen3-markers")
    build_tiny_qwen3(directory, vocab_size=TINY_VOCAB, seed=4)
    build_marker_bpe(directory, vocab_size=TINY_VOCAB)
    return directory


@pytest.fixture(scope="module")
def served(qwen3_dir) -> Iterator[ServedModel]:
    model = serve_tiny(qwen3_dir, max_model_len=256)
    yield model
    model.stop()


def steered(text: str) -> dict:
    return {
        "messages": MESSAGES,
        "max_tokens": 64,
        "logprobs": True,
        "top_logprobs": 2,
        "structured_outputs": {"choice": [text]},
    }


def test_the_tokenizer_keeps_think_markers_as_single_tokens(qwen3_dir) -> None:
    tokenizer = HfTokenizer.from_dir(qwen3_dir)

    assert len(tokenizer.encode("<think>", add_special_tokens=False)) == 1
    assert len(tokenizer.encode("</think>", add_special_tokens=False)) == 1


def test_qwen3_reasoning_is_split_and_content_entries_are_the_raw_logprobs(
    served, qwen3_dir
) -> None:
    parsing = parser_app(served, reasoning_parser="qwen3", grammar_in_reasoning=True)
    plain = create_app(ModelHolder(served=served))

    answer = http_json.post(parsing, "/v1/chat/completions", steered(THOUGHT))
    raw = http_json.post(plain, "/v1/chat/completions", steered(THOUGHT))

    message = answer["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "the fox"
    assert message["content"] == "over the dog"
    entries = answer["choices"][0]["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == b"over the dog"
    raw_entries = raw["choices"][0]["logprobs"]["content"]
    assert entries == raw_entries[-len(entries) :]
    # The raw entries are the Qwen3 model's own values: float64 log_softmax of transformers.
    tokenizer = HfTokenizer.from_dir(qwen3_dir)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES), add_special_tokens=False)
    generated = tokenizer.encode(THOUGHT, add_special_tokens=False)
    logits = checks.reference_logits(checks.reference_model(qwen3_dir), [*prompt, *generated])
    expected = logits.double().log_softmax(dim=-1)
    assert len(raw_entries) == len(generated)
    for offset, (entry, token) in enumerate(zip(raw_entries, generated, strict=True)):
        assert abs(entry["logprob"] - expected[len(prompt) - 1 + offset, token].item()) <= 1e-4
