"""Every dense family's tiny random checkpoint (Qwen3, Phi-3, Gemma 3; checks.FAMILIES) served
as transformers computes it: logits, greedy decoding, engine logprobs, bfloat16, GGUF. Each
family's own layout is checked in its test_family_<name>.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.gpu.loading.gguf_export import export_gguf
from adapters.gpu.loading.weights import load_model
from adapters.gpu.model.config import ModelConfig
from tests.support import family_checks as checks
from tests.support.gguf_files import write_gguf

pytestmark = pytest.mark.model

PROMPT = checks.FAMILY_PROMPT


@pytest.fixture(scope="module", params=list(checks.FAMILIES.values()), ids=list(checks.FAMILIES))
def family(request: pytest.FixtureRequest) -> checks.Family:
    return request.param


def test_a_checkpoint_matches_transformers_logits_in_float32(
    family_dir: Path, family_reference: torch.nn.Module
) -> None:
    ours = load_model(family_dir, dtype=torch.float32, device="cpu")
    expected = checks.reference_logits(family_reference, PROMPT)

    whole = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])
    pieces = checks.chunked_logits(ours, PROMPT, [3, 5, 1, 4])

    assert checks.max_difference(whole, expected) <= checks.FLOAT32_ATOL
    assert checks.max_difference(pieces, expected) <= checks.FLOAT32_ATOL


def test_greedy_decoding_over_the_paged_cache_continues_as_transformers_for_64_tokens(
    family_dir: Path, family_reference: torch.nn.Module
) -> None:
    ours = load_model(family_dir, dtype=torch.float32, device="cpu")

    tokens = checks.greedy_over_cache(ours, PROMPT, steps=64)

    expected = checks.reference_logits(family_reference, tokens)
    checks.assert_greedy_matches(tokens, len(PROMPT), expected)


def test_engine_logprobs_and_prompt_scores_equal_float64_log_softmax(
    family_dir: Path, family_reference: torch.nn.Module
) -> None:
    tokens, entries, scores = checks.engine_outputs(family_dir, PROMPT, max_tokens=12)

    expected = checks.reference_logits(family_reference, [*PROMPT, *tokens])
    checks.assert_logprobs_match(PROMPT, tokens, entries, scores, expected, checks.FLOAT32_ATOL)


def test_a_bfloat16_checkpoint_loads_under_both_dtypes_and_decodes_64_tokens_as_transformers(
    family: checks.Family, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A bfloat16 checkpoint loaded as float32 equals transformers' float32 upcast within
    1e-4; loaded as bfloat16, its greedy continuation of 64 tokens over the paged cache equals
    transformers' bfloat16 greedy. The checkpoint is decisive (`make_decisive`), as trained
    ones are, so bfloat16 rounding cannot flip a near-tie; the float32 checks keep the
    original random weights."""
    directory = tmp_path_factory.mktemp(f"{family.name}-bf16")
    directory = family.checkpoint(directory, torch.bfloat16, decisive=True)
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
    family: checks.Family, family_dir: Path, family_reference: torch.nn.Module, tmp_path: Path
) -> None:
    gguf_path = write_gguf(family_dir, tmp_path / f"tiny-{family.name}.gguf", family.name)

    exported = export_gguf(gguf_path, tmp_path / "exported", progress=False)
    ours = load_model(exported, dtype=torch.float32, device="cpu")

    assert ModelConfig.from_dir(exported).architecture == family.architecture
    logits = checks.chunked_logits(ours, PROMPT, [len(PROMPT)])
    expected = checks.reference_logits(family_reference, PROMPT)
    assert checks.max_difference(logits, expected) <= checks.FLOAT32_ATOL
