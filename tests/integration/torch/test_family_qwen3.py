"""A tiny random Qwen3 checkpoint (per-head q/k norms): its own layout and its GGUF tokenizer.
The checks every family passes are in test_family_checks.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.gpu.model.config import ModelConfig
from tests.support import family_checks as checks
from tests.support.gguf_vocab import byte_level_vocabulary

pytestmark = pytest.mark.model

FAMILY = "qwen3"  # the checks.FAMILIES entry the conftest fixtures build


def test_the_config_reads_qk_norms_head_dim_and_no_bias(family_dir: Path) -> None:
    config = ModelConfig.from_dir(family_dir)

    assert (config.architecture, config.qk_norm, config.head_dim) == ("Qwen3ForCausalLM", True, 32)
    assert not config.attention_bias and config.sliding_windows == (None, None)


def test_a_gguf_with_the_qwen2_pre_tokenizer_loads_through_resolve_model_dir(
    family: checks.Family, family_dir: Path, family_reference: torch.nn.Module, tmp_path: Path
) -> None:
    vocabulary = byte_level_vocabulary(family_dir, "qwen2")
    text = "<|im_start|>user\nWhat is 1234 + 5678?\n\n  Ω 🎉<|im_end|>\n"

    checks.assert_gguf_serves_as_transformers(
        family, family_dir, family_reference, tmp_path, vocabulary, text
    )
