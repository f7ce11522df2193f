"""A tiny random Phi-3 checkpoint (fused projections, longrope, a sliding window of 8): its own
layout, longrope's short factors and its GGUF tokenizer and chat template. The checks every
family passes are in test_family_checks.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from tests.support import family_checks as checks
from tests.support.gguf_vocab import (
    PHI3_CONTROL,
    PHI3_TEMPLATE,
    SPM_CONTROL,
    sentencepiece_vocabulary,
)

pytestmark = pytest.mark.model

FAMILY = "phi3"  # the checks.FAMILIES entry the conftest fixtures build

PROMPT = checks.FAMILY_PROMPT
ORIGINAL = 16  # the tiny model's original_max_position_embeddings; PROMPT is longer


def test_the_config_reads_longrope_and_the_window_of_every_layer(family_dir: Path) -> None:
    config = ModelConfig.from_dir(family_dir)

    assert config.architecture == "Phi3ForCausalLM"
    assert config.sliding_windows == (8, 8)
    assert config.rope_scaling is not None
    assert config.rope_scaling["rope_type"] == "longrope"
    assert config.rope_scaling["original_max_position_embeddings"] == ORIGINAL


def test_a_server_within_the_original_context_rotates_with_the_short_factors(
    family_dir: Path, family_reference: torch.nn.Module
) -> None:
    """transformers takes the short factors for a sequence within the original length; a model
    served with --max-model-len at most that length does the same for every sequence."""
    short = load_model(family_dir, dtype=torch.float32, device="cpu", context_length=ORIGINAL)
    long = load_model(family_dir, dtype=torch.float32, device="cpu")
    prompt = PROMPT[:ORIGINAL]

    ours = checks.chunked_logits(short, prompt, [5, 3])
    expected = checks.reference_logits(family_reference, prompt)

    assert checks.max_difference(ours, expected) <= checks.FLOAT32_ATOL
    assert checks.max_difference(checks.chunked_logits(long, prompt, [16]), expected) > 1e-2


def test_a_gguf_with_a_sentencepiece_tokenizer_loads_through_resolve_model_dir(
    family: checks.Family, family_dir: Path, family_reference: torch.nn.Module, tmp_path: Path
) -> None:
    vocabulary = sentencepiece_vocabulary(
        checks.VOCAB, controls=SPM_CONTROL + PHI3_CONTROL, chat_template=PHI3_TEMPLATE
    )
    # No whitespace after a control token: there llama.cpp (and we) drop it for Phi-3 where
    # transformers' GGUF tokenizer keeps it (tests/integration/test_gguf_tokenizer.py).
    text = "the quick  brown fox<tool>over 42 日本 🎉<|end|>next<|user|>x"
    messages = [{"role": "user", "content": "hi there"}]

    prompt, tokenizer, theirs = checks.assert_gguf_serves_as_transformers(
        family, family_dir, family_reference, tmp_path, vocabulary, text
    )

    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected
    assert prompt[0] == 1 and len(prompt) > ORIGINAL
