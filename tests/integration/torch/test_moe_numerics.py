"""Qwen3-MoE, Mixtral and DeepSeek-V3 (latent attention) logits equal transformers' logits."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.decoder import DecoderModel
from adapters.gpu.model.forward_batch import ForwardBatch, SequenceChunk
from adapters.gpu.model.kv_cache import PagedKVCache
from tests.support import family_checks as checks
from tests.support.tiny_moe_models import (
    build_tiny_deepseek_v3,
    build_tiny_mixtral,
    build_tiny_qwen2_moe,
    build_tiny_qwen3_moe,
)
from tests.support.tokenizers import build_byte_level_bpe

VOCAB_SIZE = 320
BLOCK_SIZE = 4
NUM_BLOCKS = 48
ATOL = 1e-4
# bfloat16 keeps 8 significant bits: a logit of size ~4 moves by ~0.016 per rounding, and two
# implementations that round the same math in other places drift by a few such steps. A router
# near-tie that rounding breaks another way (transformers scores experts from bfloat16 logits,
# we from float32 ones) moves a row further, by as much as bfloat16 itself moves it from the
# float32 result, so that distance bounds ours too.
BF16_ATOL = 0.25
WINDOW = 6
DEVICE = torch.device("cpu")
FAMILIES = {
    "qwen2-moe-shared": lambda d, dtype, **kw: build_tiny_qwen2_moe(
        d, vocab_size=VOCAB_SIZE, seed=3, dtype=dtype, **kw
    ),
    "qwen3-moe": lambda d, dtype, **kw: build_tiny_qwen3_moe(
        d, vocab_size=VOCAB_SIZE, dtype=dtype, **kw
    ),
    "mixtral-window-6": lambda d, dtype, **kw: build_tiny_mixtral(
        d, vocab_size=VOCAB_SIZE, sliding_window=WINDOW, seed=1, dtype=dtype, **kw
    ),
    "deepseek-v3": lambda d, dtype, **kw: build_tiny_deepseek_v3(
        d, vocab_size=VOCAB_SIZE, seed=2, dtype=dtype, **kw
    ),
    # DeepSeek-V2-Lite's shape: no query latent; here also biases and rotate-half rope pairs.
    "deepseek-direct-q-bias": lambda d, dtype, **kw: build_tiny_deepseek_v3(
        d,
        vocab_size=VOCAB_SIZE,
        seed=4,
        dtype=dtype,
        q_lora_rank=None,
        attention_bias=True,
        rope_interleave=False,
        norm_topk_prob=False,
        **kw,
    ),
}


@dataclass
class Checkpoint:
    """One tiny checkpoint directory and transformers' float32 model of it."""

    family: str
    directory: Path
    reference: torch.nn.Module

    def reference_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.reference(torch.tensor([list(tokens)])).logits[0].float()


def _reference(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    directory = FAMILIES[request.param](tmp_path_factory.mktemp(request.param), torch.float32)
    return Checkpoint(request.param, directory, _reference(directory, torch.float32))


def random_tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(count)]


def run(model: DecoderModel, chunks: Sequence[SequenceChunk], cache: PagedKVCache) -> torch.Tensor:
    batch = ForwardBatch.build(chunks, BLOCK_SIZE, DEVICE)
    return model.compute_logits(model(batch, cache))


def new_cache(model: DecoderModel, dtype: torch.dtype = torch.float32) -> PagedKVCache:
    return PagedKVCache.allocate(model.config, NUM_BLOCKS, BLOCK_SIZE, dtype, DEVICE)


def chunked_then_decoded(model: DecoderModel, tokens: list[int], blocks: tuple[int, ...]):
    """Logits of `tokens` fed as prompt chunks of 7, 1 and 12 tokens, then one per forward."""
    cache, rows, start = new_cache(model, model.dtype), [], 0
    for size in (7, 1, 12):
        rows.append(
            run(model, [SequenceChunk(tuple(tokens[start : start + size]), start, blocks)], cache)
        )
        start += size
    for position in range(start, len(tokens)):
        rows.append(run(model, [SequenceChunk((tokens[position],), position, blocks)], cache))
    return torch.cat(rows)


def max_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual - expected).abs().max().item()


@pytest.mark.model
def test_prefill_chunks_and_decode_rows_match_transformers_beyond_the_window(checkpoint):
    """A 36-token prompt (six times Mixtral's window) in one forward, then in chunks and
    single-token decode steps over scrambled blocks: every row equals transformers' within
    1e-4 (both paths through the routed experts and, for DeepSeek, the latent cache)."""
    model = load_model(checkpoint.directory, dtype=torch.float32, device=DEVICE)
    tokens = random_tokens(36, seed=3)
    blocks = tuple(random.Random(4).sample(range(NUM_BLOCKS), 9))
    expected = checkpoint.reference_logits(tokens)

    whole = run(model, [SequenceChunk(tuple(tokens), 0, blocks)], new_cache(model))
    pieces = chunked_then_decoded(model, tokens, blocks)

    assert max_difference(whole, expected) <= ATOL
    assert max_difference(pieces, expected) <= ATOL


@pytest.mark.model
def test_a_bfloat16_checkpoint_loads_as_both_dtypes_and_decodes_64_tokens_as_transformers(
    checkpoint, tmp_path_factory: pytest.TempPathFactory
):
    """The same family stored in bfloat16: loaded as float32 it equals transformers' float32
    upcast within 1e-4; loaded as bfloat16 it stays within bfloat16 rounding of
    transformers' bfloat16 model (see BF16_ATOL), every row's argmax agrees, and its greedy
    continuation of 64 tokens over the paged cache equals transformers' bfloat16 greedy. The
    bfloat16 checkpoint is decisive (`make_decisive`), as trained ones are, so rounding (a
    router near-tie included) cannot flip the next token; the float32 checks above keep the
    original random weights."""
    name = checkpoint.family
    directory = FAMILIES[name](
        tmp_path_factory.mktemp(name + "-bf16"), torch.bfloat16, decisive=True
    )
    tokens = random_tokens(30, seed=5)
    blocks = tuple(range(8))
    upcast = _reference(directory, torch.float32)
    native = _reference(directory, torch.bfloat16)
    with torch.no_grad():
        expected32 = upcast(torch.tensor([tokens])).logits[0].float()
        expected16 = native(torch.tensor([tokens])).logits[0].float()

    as32 = load_model(directory, dtype=torch.float32, device=DEVICE)
    as16 = load_model(directory, dtype=torch.bfloat16, device=DEVICE)
    got32 = run(as32, [SequenceChunk(tuple(tokens), 0, blocks)], new_cache(as32))
    got16 = chunked_then_decoded(as16, tokens, blocks)

    assert {p.dtype for p in as16.parameters() if p.dtype != torch.float32} == {torch.bfloat16}
    assert max_difference(got32, expected32) <= ATOL
    assert max_difference(got16, expected16) <= max(
        BF16_ATOL, max_difference(expected16, expected32)
    )
    assert torch.equal(got16.argmax(-1), expected16.argmax(-1))
    checks.assert_bfloat16_greedy_matches(as16, native, random_tokens(24, seed=3), steps=64)
    build_byte_level_bpe(directory, vocab_size=VOCAB_SIZE)
    checks.assert_bfloat16_engine_logprobs(directory, native, random_tokens(24, seed=3))
