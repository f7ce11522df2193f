"""A tiny random Gemma 3 text checkpoint (sandwich norms, five sliding-window layers of window 8
and one global layer with their own rope bases, soft-capped logits) served as transformers
computes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.gpu.loading.default_model import resolve_model_dir
from adapters.gpu.loading.gguf_export import export_gguf
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.tokenizer.hf import HfTokenizer
from tests.support import family_checks as checks
from tests.support.gguf_files import write_gguf
from tests.support.gguf_vocab import sentencepiece_vocabulary
from tests.support.tiny_models import build_tiny_gemma3
from tests.support.tokenizers import build_byte_level_bpe

pytestmark = pytest.mark.model

PROMPT = checks.random_tokens(24, seed=3)


def _checkpoint(directory: Path, dtype: torch.dtype, decisive: bool = False) -> Path:
    # A decisive head is its own matrix; Gemma 3 ties it to the embeddings by default.
    untied = {"tie_word_embeddings": False} if decisive else {}
    build_tiny_gemma3(
        directory, vocab_size=checks.VOCAB, seed=4, dtype=dtype, decisive=decisive, **untied
    )
    build_byte_level_bpe(directory, vocab_size=checks.VOCAB)
    return directory


@pytest.fixture(scope="module")
def float32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("gemma3-f32"), torch.float32)


@pytest.fixture(scope="module")
def reference(float32_dir: Path) -> torch.nn.Module:
    return checks.reference_model(float32_dir)


def test_the_config_reads_the_gemma_layout(float32_dir: Path) -> None:
    config = ModelConfig.from_dir(float32_dir)

    assert config.architecture == "Gemma3ForCausalLM"
    assert config.sliding_windows == (8, 8, 8, 8, 8, None)
    assert (config.rope_theta, config.local_rope_theta) == (1_000_000.0, 10_000.0)
    assert (config.hidden_act, config.norm_weight_offset) == ("gelu_pytorch_tanh", 1.0)
    assert config.qk_norm and config.sandwich_norms and config.tie_word_embeddings
    assert config.embedding_multiplier == 8.0 and config.final_logit_softcapping == 5.0
    assert config.attention_multiplier == 32**-0.5


def test_query_pre_attn_scalar_sets_the_attention_scale(float32_dir: Path) -> None:
    import json

    raw = json.loads((float32_dir / "config.json").read_text())
    raw["query_pre_attn_scalar"] = 168

    assert ModelConfig.from_hf_dict(raw).attention_multiplier == 168**-0.5


def test_soft_capped_logits_are_the_raw_logits_within_the_cap(float32_dir: Path) -> None:
    ours = load_model(float32_dir, dtype=torch.float32, device="cpu")

    logits = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])

    assert logits.abs().max().item() < 5.0
    assert logits.abs().max().item() > 3.0, "the cap bends these logits"


def test_a_gemma3_checkpoint_matches_transformers_logits_in_float32(
    float32_dir: Path, reference: torch.nn.Module
) -> None:
    ours = load_model(float32_dir, dtype=torch.float32, device="cpu")
    expected = checks.reference_logits(reference, PROMPT)

    whole = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])
    pieces = checks.chunked_logits(ours, PROMPT, [3, 5, 1, 4])

    assert checks.max_difference(whole, expected) <= checks.FLOAT32_ATOL
    assert checks.max_difference(pieces, expected) <= checks.FLOAT32_ATOL


def test_greedy_decoding_over_the_paged_cache_continues_as_transformers_for_64_tokens(
    float32_dir: Path, reference: torch.nn.Module
) -> None:
    ours = load_model(float32_dir, dtype=torch.float32, device="cpu")

    tokens = checks.greedy_over_cache(ours, PROMPT, steps=64)

    checks.assert_greedy_matches(tokens, len(PROMPT), checks.reference_logits(reference, tokens))


def test_engine_logprobs_and_prompt_scores_equal_float64_log_softmax(
    float32_dir: Path, reference: torch.nn.Module
) -> None:
    tokens, entries, scores = checks.engine_outputs(float32_dir, PROMPT, max_tokens=12)

    expected = checks.reference_logits(reference, [*PROMPT, *tokens])
    checks.assert_logprobs_match(PROMPT, tokens, entries, scores, expected, checks.FLOAT32_ATOL)


def test_a_bfloat16_checkpoint_loads_under_both_dtypes_and_decodes_64_tokens_as_transformers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A bfloat16 checkpoint loaded as float32 equals transformers' float32 upcast within
    1e-4; loaded as bfloat16, its greedy continuation of 64 tokens over the paged cache equals
    transformers' bfloat16 greedy. The checkpoint is decisive (`make_decisive`), as trained
    ones are, so bfloat16 rounding cannot flip a near-tie; the float32 checks keep the
    original random weights."""
    directory = _checkpoint(tmp_path_factory.mktemp("gemma3-bf16"), torch.bfloat16, decisive=True)
    upcast = checks.reference_model(directory, torch.float32)
    native = checks.reference_model(directory, torch.bfloat16)

    as_float32 = load_model(directory, dtype=torch.float32, device="cpu")
    as_bfloat16 = load_model(directory, dtype=torch.bfloat16, device="cpu")

    assert as_bfloat16.embed_weight.dtype == torch.bfloat16
    float32_logits = checks.chunked_logits(as_float32, PROMPT, [len(PROMPT)])
    expected32 = checks.reference_logits(upcast, PROMPT)
    assert checks.max_difference(float32_logits, expected32) <= checks.FLOAT32_ATOL
    tokens = checks.assert_bfloat16_greedy_matches(as_bfloat16, native, PROMPT, steps=64)
    checks.assert_bfloat16_engine_logprobs(directory, native, PROMPT)
    prefill = checks.chunked_logits(as_bfloat16, tokens, [len(tokens)])
    expected16 = checks.reference_logits(native, tokens)
    assert checks.max_difference(prefill, expected16) <= checks.BFLOAT16_ATOL


def test_the_checkpoint_written_as_gguf_loads_to_the_same_logits(
    float32_dir: Path, reference: torch.nn.Module, tmp_path: Path
) -> None:
    gguf_path = write_gguf(float32_dir, tmp_path / "tiny-gemma3.gguf", "gemma3")

    exported = export_gguf(gguf_path, tmp_path / "exported", progress=False)
    ours = load_model(exported, dtype=torch.float32, device="cpu")

    assert ModelConfig.from_dir(exported).architecture == "Gemma3ForCausalLM"
    logits = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])
    expected = checks.reference_logits(reference, PROMPT)
    assert checks.max_difference(logits, expected) <= checks.FLOAT32_ATOL


def test_a_gguf_with_a_sentencepiece_tokenizer_loads_through_resolve_model_dir(
    float32_dir: Path, reference: torch.nn.Module, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    vocabulary = sentencepiece_vocabulary(checks.VOCAB, add_space_prefix=False)
    gguf_path = write_gguf(float32_dir, tmp_path / "tiny-gemma3.gguf", "gemma3", vocabulary)
    text = "the quick  brown fox<tool>over 42 日本 🎉</s>"

    exported = resolve_model_dir(str(gguf_path), cache_dir=tmp_path / "cache", progress=False)
    prompt = HfTokenizer.from_dir(exported).encode(text)
    ours = load_model(exported, dtype=torch.float32, device="cpu")

    assert prompt == AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf_path.name).encode(text)
    assert prompt[0] == 1 and len(prompt) > len(PROMPT)
    logits = checks.chunked_logits(ours, prompt, [len(prompt)])
    expected = checks.reference_logits(reference, prompt)
    assert checks.max_difference(logits, expected) <= checks.FLOAT32_ATOL
