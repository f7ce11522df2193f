"""Qwen3-MoE, Mixtral and DeepSeek-V3 (latent attention) logits equal transformers' logits."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.decoder import DecoderModel
from tests.support import family_checks as checks
from tests.support.tiny_moe_models import (
    build_tiny_deepseek_v3,
    build_tiny_mixtral,
    build_tiny_qwen2_moe,
    build_tiny_qwen3_moe,
)
from tests.support.tokenizers import build_byte_level_bpe

VOCAB_SIZE = checks.VOCAB
WINDOW = 6
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


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    directory = FAMILIES[request.param](tmp_path_factory.mktemp(request.param), torch.float32)
    return Checkpoint(request.param, directory, checks.reference_model(directory))


class RouterNearTies:
    """The greedy steps a router near-tie moved, for `assert_bfloat16_greedy_matches`.

    A random router meets near-ties: one seen here kept two expert groups 0.0006 apart, and
    on one CPU bfloat16 rounding kept the other group, moving that row by 1.8 (its token still
    agreed). Such a step is ours when our bfloat16 greedy routed it to other experts than our
    float32 model does on the same tokens, and transformers' when its bfloat16 row differs
    from its float32 row beyond rounding. More than two in 64 steps would be no near-tie but
    a bfloat16 routing fault, and fails.
    """

    MOST = 2

    def __init__(
        self,
        ours16: DecoderModel,
        ours32: DecoderModel,
        upcast: torch.nn.Module,
        prompt_length: int,
    ) -> None:
        self._greedy_logs = checks.routing_logs(ours16)  # filled by the greedy decoding to come
        self._ours32, self._upcast = ours32, upcast
        self._prompt_length = prompt_length

    def __call__(self, tokens: list[int], expected_rows: torch.Tensor) -> set[int]:
        steps, first = expected_rows.shape[0], self._prompt_length - 1
        teacher_forced = tokens[: first + steps]
        float32_logs = checks.routing_logs(self._ours32)
        checks.chunked_logits(self._ours32, teacher_forced, [len(teacher_forced)])
        moved = set()
        for greedy_log, float32_log in zip(self._greedy_logs, float32_logs, strict=True):
            # Forward j of the greedy decoding (0: the prompt) made step j's row, its last.
            for step in range(steps):
                picked16 = greedy_log[step][-1].sort().values
                picked32 = float32_log[0][first + step].sort().values
                if not torch.equal(picked16, picked32):
                    moved.add(step)
        upcast_rows = checks.reference_logits(self._upcast, teacher_forced)[first:]
        apart = (upcast_rows - expected_rows.float()).abs().amax(dim=-1)
        moved |= set(torch.nonzero(apart > checks.BFLOAT16_ATOL).flatten().tolist())
        assert len(moved) <= self.MOST, f"router near-ties at steps {sorted(moved)}"
        return moved


def chunked_then_decoded(model: DecoderModel, tokens: list[int], blocks: tuple[int, ...]):
    """Logits of `tokens` fed as prompt chunks of 7, 1 and 12 tokens, then one per forward."""
    return checks.chunked_logits(model, tokens, [7, 1, 12], blocks)


@pytest.mark.model
def test_prefill_chunks_and_decode_rows_match_transformers_beyond_the_window(checkpoint):
    """A 36-token prompt (six times Mixtral's window) in one forward, then in chunks and
    single-token decode steps over scrambled blocks: every row equals transformers' within
    1e-4 (both paths through the routed experts and, for DeepSeek, the latent cache)."""
    model = load_model(checkpoint.directory, dtype=torch.float32, device="cpu")
    tokens = checks.random_tokens(36, seed=3)
    blocks = tuple(random.Random(4).sample(range(checks.NUM_BLOCKS), 9))
    expected = checks.reference_logits(checkpoint.reference, tokens)

    whole = checks.chunked_logits(model, tokens, [len(tokens)], blocks)
    pieces = chunked_then_decoded(model, tokens, blocks)

    assert checks.max_difference(whole, expected) <= checks.FLOAT32_ATOL
    assert checks.max_difference(pieces, expected) <= checks.FLOAT32_ATOL


@pytest.mark.model
def test_a_bfloat16_checkpoint_loads_as_both_dtypes_and_decodes_64_tokens_as_transformers(
    checkpoint, tmp_path_factory: pytest.TempPathFactory
):
    """The same family stored in bfloat16: loaded as float32 it equals transformers' float32
    upcast within 1e-4; loaded as bfloat16 it stays within bfloat16 rounding of
    transformers' bfloat16 model (see below), every row's argmax agrees, and its greedy
    continuation of 64 tokens over the paged cache equals transformers' bfloat16 greedy. The
    bfloat16 checkpoint is decisive (`make_decisive`), as trained ones are, so rounding (a
    router near-tie included) cannot flip the next token; the float32 checks above keep the
    original random weights."""
    name = checkpoint.family
    directory = FAMILIES[name](
        tmp_path_factory.mktemp(name + "-bf16"), torch.bfloat16, decisive=True
    )
    tokens = checks.random_tokens(30, seed=5)
    blocks = tuple(range(8))
    upcast = checks.reference_model(directory, torch.float32)
    native = checks.reference_model(directory, torch.bfloat16)
    expected32 = checks.reference_logits(upcast, tokens)
    expected16 = checks.reference_logits(native, tokens)

    as32 = load_model(directory, dtype=torch.float32, device="cpu")
    as16 = load_model(directory, dtype=torch.bfloat16, device="cpu")
    got32 = checks.chunked_logits(as32, tokens, [len(tokens)], blocks)
    got16 = chunked_then_decoded(as16, tokens, blocks)

    assert {p.dtype for p in as16.parameters() if p.dtype != torch.float32} == {torch.bfloat16}
    assert checks.max_difference(got32, expected32) <= checks.FLOAT32_ATOL
    # Beyond bfloat16 rounding (checks.BFLOAT16_ATOL), a router near-tie that rounding breaks
    # another way (transformers scores experts from bfloat16 logits, we from float32 ones)
    # moves a row further, by as much as bfloat16 itself moves it from the float32 result, so
    # that distance bounds ours too.
    bound = max(checks.BFLOAT16_ATOL, checks.max_difference(expected16, expected32))
    assert checks.max_difference(got16, expected16) <= bound
    assert torch.equal(got16.argmax(-1), expected16.argmax(-1))
    prompt = checks.FAMILY_PROMPT
    rerouted = RouterNearTies(as16, as32, upcast, len(prompt))
    checks.assert_bfloat16_greedy_matches(as16, native, prompt, steps=64, rerouted=rerouted)
    build_byte_level_bpe(directory, vocab_size=VOCAB_SIZE)
    checks.assert_bfloat16_engine_logprobs(directory, native, prompt)
