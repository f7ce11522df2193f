"""A tiny random Gemma 3 text checkpoint (sandwich norms, five sliding-window layers of window 8
and one global layer with their own rope bases, soft-capped logits): its own layout and its
GGUF tokenizer. The checks every family passes are in test_family_checks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from tests.support import family_checks as checks
from tests.support.gguf_vocab import sentencepiece_vocabulary

pytestmark = pytest.mark.model

FAMILY = "gemma3"  # the checks.FAMILIES entry the conftest fixtures build

PROMPT = checks.FAMILY_PROMPT


def test_the_config_reads_the_gemma_layout(family_dir: Path) -> None:
    config = ModelConfig.from_dir(family_dir)

    assert config.architecture == "Gemma3ForCausalLM"
    assert config.sliding_windows == (8, 8, 8, 8, 8, None)
    assert (config.rope_theta, config.local_rope_theta) == (1_000_000.0, 10_000.0)
    assert (config.hidden_act, config.norm_weight_offset) == ("gelu_pytorch_tanh", 1.0)
    assert config.qk_norm and config.sandwich_norms and config.tie_word_embeddings
    assert config.embedding_multiplier == 8.0 and config.final_logit_softcapping == 5.0
    assert config.attention_multiplier == 32**-0.5


def test_query_pre_attn_scalar_sets_the_attention_scale(family_dir: Path) -> None:
    raw = json.loads((family_dir / "config.json").read_text())
    raw["query_pre_attn_scalar"] = 168

    assert ModelConfig.from_hf_dict(raw).attention_multiplier == 168**-0.5


def test_soft_capped_logits_are_the_raw_logits_within_the_cap(family_dir: Path) -> None:
    ours = load_model(family_dir, dtype=torch.float32, device="cpu")

    logits = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])

    assert logits.abs().max().item() < 5.0
    assert logits.abs().max().item() > 3.0, "the cap bends these logits"


def test_a_gguf_with_a_sentencepiece_tokenizer_loads_through_resolve_model_dir(
    family: checks.Family, family_dir: Path, family_reference: torch.nn.Module, tmp_path: Path
) -> None:
    vocabulary = sentencepiece_vocabulary(checks.VOCAB, add_space_prefix=False)
    text = "the quick  brown fox<tool>over 42 日本 🎉</s>"

    prompt, _, _ = checks.assert_gguf_serves_as_transformers(
        family, family_dir, family_reference, tmp_path, vocabulary, text
    )

    assert prompt[0] == 1 and len(prompt) > len(PROMPT)
