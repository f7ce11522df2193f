"""Our RoPE scaling variants reproduce transformers' frequencies and end-to-end logits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers
from transformers import modeling_rope_utils as rope_utils

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from adapters.gpu.model.rope import (
    RotaryEmbedding,
    apply_rotary,
    dynamic_ntk_inverse_frequencies,
    inverse_frequencies,
)
from tests.support.tiny_models import build_tiny_llama

VOCAB_SIZE = 320
BLOCK_SIZE = 4
HEAD_DIM = 32
MAX_POSITIONS = 64
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 16,
        "beta_slow": 2,
        "mscale": 0.8,
        "mscale_all_dim": 0.5,
        "truncate": False,
    },
}


def hf_config(scaling: dict[str, object] | None) -> object:
    parameters = {"rope_theta": 50_000.0, **(scaling or {"rope_type": "default"})}
    return transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=4 * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=parameters,
    )


def our_config(hf: object) -> ModelConfig:
    return ModelConfig.from_hf_dict({"architectures": ["LlamaForCausalLM"], **hf.to_dict()})


@pytest.mark.parametrize("variant", sorted(SCALINGS))
def test_inverse_frequencies_and_attention_factor_match_transformers(variant: str) -> None:
    """Each scaling variant's static frequencies and cos/sin factor equal transformers'."""
    hf = hf_config(SCALINGS[variant])
    expected, expected_factor = rope_utils.ROPE_INIT_FUNCTIONS[SCALINGS[variant]["rope_type"]](hf)

    actual, factor = inverse_frequencies(our_config(hf))

    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)


def test_plain_inverse_frequencies_match_transformers() -> None:
    """Without scaling the frequencies are theta ** (-2i / head_dim)."""
    hf = hf_config(None)
    expected, _ = (
        transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(
            hf
        )
    )

    actual, factor = inverse_frequencies(our_config(hf))

    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0)
    assert factor == 1.0


@pytest.mark.parametrize("position", [0, 10, MAX_POSITIONS - 1, MAX_POSITIONS, 100, 1000])
def test_dynamic_ntk_frequencies_follow_the_length_up_to_each_position(position: int) -> None:
    """Position p uses transformers' dynamic base for a sequence of length p + 1 (never less
    than the pretrained context, where the frequencies are the plain ones)."""
    hf = hf_config(SCALINGS["dynamic"])
    expected, _ = rope_utils.ROPE_INIT_FUNCTIONS["dynamic"](hf, seq_len=position + 1)

    actual = dynamic_ntk_inverse_frequencies(our_config(hf), torch.tensor([position]))

    torch.testing.assert_close(actual[0], expected, rtol=2e-6, atol=0)


def test_rotation_matches_transformers_rotate_half_convention() -> None:
    """x * cos + rotate_half(x) * sin, with the first and second halves as the pairs."""
    modeling = transformers.models.llama.modeling_llama
    hf = hf_config(SCALINGS["yarn"])
    positions = torch.tensor([0, 3, 17, 40])
    heads = torch.randn(4, 3, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    rotary = modeling.LlamaRotaryEmbedding(hf)
    hf_cos, hf_sin = rotary(heads, positions[None])
    expected, _ = modeling.apply_rotary_pos_emb(
        heads.transpose(0, 1)[None], heads.transpose(0, 1)[None], hf_cos, hf_sin
    )

    cos, signed_sin = RotaryEmbedding(our_config(hf), torch.device("cpu")).cos_sin(
        positions, torch.float32
    )
    actual = apply_rotary(heads, cos, signed_sin)

    torch.testing.assert_close(actual, expected[0].transpose(0, 1), rtol=0, atol=1e-6)


def _decode_token_by_token(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    model = load_model(model_dir, dtype=torch.float32, device=torch.device("cpu"))
    cache = PagedKVCache.allocate(model.config, 8, BLOCK_SIZE, torch.float32, "cpu")
    blocks = (5, 2, 7, 0, 3, 6)
    rows = []
    for position, token_id in enumerate(tokens):
        batch = ForwardBatch.build(
            [SequenceChunk((token_id,), position, blocks)], BLOCK_SIZE, "cpu"
        )
        rows.append(model.compute_logits(model(batch, cache)))
    return torch.cat(rows)


@pytest.mark.model
def test_dynamic_ntk_decode_past_the_context_matches_transformers_incremental_decode(
    tmp_path: Path,
) -> None:
    """Beyond max_position_embeddings, decoding one token at a time agrees with transformers
    decoding with its own cache (where the base grows step by step)."""
    model_dir = build_tiny_llama(
        tmp_path,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=8,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10_000.0},
    )
    rng = random.Random(5)
    tokens = [rng.randrange(VOCAB_SIZE) for _ in range(20)]
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    expected, hf_cache = [], None
    with torch.no_grad():
        for token_id in tokens:
            output = reference(torch.tensor([[token_id]]), cache=hf_cache, use_cache=True)
            hf_cache = output.cache
            expected.append(output.logits[0])

    actual = _decode_token_by_token(model_dir, tokens)

    torch.testing.assert_close(actual, torch.cat(expected), rtol=0, atol=1e-4)


@pytest.mark.model
def test_yarn_scaled_model_prefill_matches_transformers(tmp_path: Path) -> None:
    """YaRN's attention factor scales cos/sin; the whole model agrees with transformers."""
    model_dir = build_tiny_llama(
        tmp_path,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 10_000.0, **SCALINGS["yarn"]},
    )
    rng = random.Random(6)
    tokens = [rng.randrange(VOCAB_SIZE) for _ in range(24)]
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]

    actual = _decode_token_by_token(model_dir, tokens)

    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)
