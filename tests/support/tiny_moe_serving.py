"""Complete tiny mixture-of-experts model directories (weights plus a tokenizer) for engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.tiny_moe_models import (
    build_tiny_deepseek_v3,
    build_tiny_mixtral,
    build_tiny_qwen2_moe,
    build_tiny_qwen3_moe,
)
from tests.support.tokenizers import build_byte_level_bpe

MOE_VOCAB = 320
MOE_BUILDERS = {
    "qwen2-moe": build_tiny_qwen2_moe,
    "qwen3-moe": build_tiny_qwen3_moe,
    "mixtral": build_tiny_mixtral,
    "deepseek-v3": build_tiny_deepseek_v3,
}


def build_tiny_moe_model_dir(directory: Path, family: str, **overrides: Any) -> Path:
    """Weights of `family` (`MOE_BUILDERS`), then the tiny byte-level tokenizer."""
    MOE_BUILDERS[family](directory, vocab_size=MOE_VOCAB, **overrides)
    build_byte_level_bpe(directory, vocab_size=MOE_VOCAB)
    return directory
