"""A complete tiny model directory (random weights plus a trained tokenizer) for engine tests."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_models import build_tiny_llama, build_tiny_qwen2
from tests.support.tokenizers import build_byte_fallback, build_byte_level_bpe

TINY_VOCAB = 320


def build_tiny_model_dir(
    directory: Path,
    *,
    family: str = "llama",
    byte_fallback: bool = False,
    max_position_embeddings: int = 512,
) -> Path:
    """Writes weights first, then the tokenizer, whose generation config (two EOS IDs) wins."""
    builder = {"llama": build_tiny_llama, "qwen2": build_tiny_qwen2}[family]
    builder(directory, vocab_size=TINY_VOCAB, max_position_embeddings=max_position_embeddings)
    tokenizer_builder = build_byte_fallback if byte_fallback else build_byte_level_bpe
    tokenizer_builder(directory, vocab_size=TINY_VOCAB)
    return directory
