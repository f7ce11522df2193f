"""A complete tiny model directory (random weights plus a trained tokenizer) for engine tests."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_models import build_tiny_llama, build_tiny_qwen2
from tests.support.tokenizers import build_byte_fallback, build_byte_level_bpe, build_marker_bpe

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


def build_marker_model_dir(directory: Path) -> Path:
    """The tiny llama with a tokenizer whose `<think>`, `</think>`, `<tool_call>` and
    `</tool_call>` are single added tokens kept in decoded text."""
    build_tiny_llama(directory, vocab_size=TINY_VOCAB, max_position_embeddings=512)
    build_marker_bpe(directory, vocab_size=TINY_VOCAB)
    return directory


def build_thinking_model_dir(directory: Path) -> Path:
    """`build_marker_model_dir` whose chat template opens a reasoning block after the
    generation prompt, as DeepSeek-R1's does: answers start inside `<think>`."""
    import json

    build_marker_model_dir(directory)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    template = config["chat_template"]
    # `-}}` trims the template's indentation that follows, so the prompt ends with the start.
    opened = template.replace("<|im_start|>assistant\n", "<|im_start|>assistant\n{{ '<think>' -}}")
    if opened == template:
        raise ValueError("the chat template has no generation prompt to open a block after")
    config["chat_template"] = opened
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory


# Short prompts the ending model is tuned on; any text of the tiny tokenizer's corpus would do.
_PROBE_WORDS = (
    *("the", "quick", "brown", "fox", "every", "request", "gets", "its", "own", "slot"),
    *("nothing", "stale", "leaks", "into", "a", "new", "answer", "server", "to", "client"),
)
# EOS's head row becomes this multiple of the most often greedy token's row: wherever that
# token was the (positive) argmax, EOS now wins, and it often wins where it came close.
_EOS_GAIN = 1.25


def build_ending_model_dir(directory: Path) -> Path:
    """A tiny model that ends deliberately: greedy decoding often stops with EOS after a few
    tokens, so tests meet terminating EOS right after a prompt or a short continuation.

    The EOS row of the LM head is a scaled copy of the row of the token the random model picks
    most often over short probe prompts; everything else is `build_tiny_model_dir`'s model.
    """
    import random
    from collections import Counter

    import torch
    import transformers

    build_tiny_model_dir(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    generator = random.Random(0)
    picks: Counter[int] = Counter()
    with torch.inference_mode():
        for _ in range(60):
            words = generator.sample(_PROBE_WORDS, generator.randint(2, 5))
            token_ids = tokenizer(" ".join(words), add_special_tokens=False).input_ids
            picks[int(model(torch.tensor([token_ids])).logits[0, -1].argmax())] += 1
        favourite = picks.most_common(1)[0][0]
        head = model.lm_head.weight
        head[tokenizer.eos_token_id] = _EOS_GAIN * head[favourite]
    model.save_pretrained(directory)
    return directory


def build_draft_model_dir(
    directory: Path, target_dir: Path, *, noise: float, seed: int = 1
) -> Path:
    """A draft for `target_dir`'s model: the same tokenizer and shape, every weight moved by
    Gaussian noise of std `noise` (0 gives an exact copy), so drafts agree with the target
    often but not always."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(target_dir, directory, dirs_exist_ok=True)
    path = directory / "model.safetensors"
    weights = load_file(path)
    generator = torch.Generator().manual_seed(seed)
    moved = {
        name: tensor + noise * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in weights.items()
    }
    save_file(moved, path, metadata={"format": "pt"})
    return directory


# Three normalizer tiles, the last one short: 2 ranks hold 2048 + 452 IDs, 3 ranks 1024 + 1024 +
# 452, so no split is even.
PARALLEL_VOCAB = 2500


def build_parallel_model_dir(
    directory: Path, *, family: str = "llama", seed: int = 0, **overrides: object
) -> Path:
    """A tiny model whose every split is uneven: 6 query heads over 3 key/value heads (2 ranks
    hold 2 + 1 of them), 160 MLP columns and a 2500-token vocabulary (neither divides by 2 or
    3), with biases where the family has them; `overrides` reach the transformers config."""
    from tests.support.tokenizers import build_byte_level_bpe, syllable_corpus

    builder = {"llama": build_tiny_llama, "qwen2": build_tiny_qwen2}[family]
    shape = {
        "hidden_size": 96,
        "intermediate_size": 160,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 16,
    }
    shape.update(overrides)  # type: ignore[arg-type]
    builder(directory, vocab_size=PARALLEL_VOCAB, seed=seed, **shape)
    build_byte_level_bpe(directory, vocab_size=PARALLEL_VOCAB, corpus=syllable_corpus())
    return directory
