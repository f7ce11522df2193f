"""Builders of tiny random transformers checkpoints (config.json + safetensors) for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# Wide enough that logits differ clearly between tokens, so greedy decoding varies.
DEFAULT_INIT_STD = 0.15
# A decisive checkpoint's embeddings are this much wider than DEFAULT_INIT_STD, so each token's
# own embedding outweighs what attention and the MLPs add to the residual stream.
DECISIVE_EMBED_GAIN = 20.0
# ... and its top logit is about this large before any soft-capping.
DECISIVE_TOP_LOGIT = 8.0
_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def build_tiny_llama(
    directory: Path | str,
    *,
    tie_word_embeddings: bool = False,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Writes a random `LlamaForCausalLM` (GQA: 4 query heads, 2 key/value heads) and returns
    its directory. `overrides` go to `LlamaConfig` (e.g. `rope_parameters`, `num_hidden_layers`).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = {**_SHAPE, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2}
    settings.update(overrides)
    config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings, **settings)
    return _save(LlamaForCausalLM, config, directory, seed, init_std, max_shard_size)


def build_tiny_qwen2(
    directory: Path | str,
    *,
    tie_word_embeddings: bool = False,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Writes a random `Qwen2ForCausalLM` (q/k/v biases randomised too); returns its directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    settings = {**_SHAPE, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2}
    settings.update(overrides)
    config = Qwen2Config(vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings, **settings)
    return _save(Qwen2ForCausalLM, config, directory, seed, init_std, max_shard_size)


def build_tiny_mistral(
    directory: Path | str,
    *,
    tie_word_embeddings: bool = False,
    vocab_size: int = 384,
    sliding_window: int | None = None,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Writes a random `MistralForCausalLM`, optionally with a sliding attention window."""
    from transformers import MistralConfig, MistralForCausalLM

    settings = {**_SHAPE, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2}
    settings.update(overrides)
    config = MistralConfig(
        vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings,
        sliding_window=sliding_window,
        **settings,
    )
    return _save(MistralForCausalLM, config, directory, seed, init_std, max_shard_size)


def build_tiny_qwen3(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """Writes a random `Qwen3ForCausalLM` (per-head q/k norms; head_dim 32, not hidden/heads)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    settings = {**_SHAPE, "head_dim": 32, "max_position_embeddings": 512}
    settings.update(bos_token_id=1, eos_token_id=2, **overrides)
    config = Qwen3Config(vocab_size=vocab_size, **settings)
    return _save(Qwen3ForCausalLM, config, directory, seed, init_std, None, dtype, decisive)


def build_tiny_phi3(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    original_positions: int = 16,
    **overrides: Any,
) -> Path:
    """Writes a random `Phi3ForCausalLM` (fused qkv_proj and gate_up_proj) with longrope
    scaling: `original_positions` of pretraining, distinct short and long factors."""
    from transformers import Phi3Config, Phi3ForCausalLM

    half = _SHAPE["hidden_size"] // _SHAPE["num_attention_heads"] // 2
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10_000.0,
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.5 + 0.75 * i for i in range(half)],
    }
    settings = {**_SHAPE, "max_position_embeddings": 128, "rope_parameters": rope}
    settings.update(
        original_max_position_embeddings=original_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        **overrides,
    )
    config = Phi3Config(vocab_size=vocab_size, **settings)
    return _save(Phi3ForCausalLM, config, directory, seed, init_std, None, dtype, decisive)


def build_tiny_gemma3(
    directory: Path | str,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    **overrides: Any,
) -> Path:
    """Writes a random `Gemma3ForCausalLM`: six layers (five sliding-window layers of window 8
    and one global, llama.cpp's fixed pattern), head_dim 32, logits soft-capped at 5."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    settings = {
        **_SHAPE,
        "num_hidden_layers": 6,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 8,
        "final_logit_softcapping": 5.0,
        "max_position_embeddings": 512,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    settings.update(overrides)
    config = Gemma3TextConfig(vocab_size=vocab_size, **settings)
    return _save(Gemma3ForCausalLM, config, directory, seed, init_std, None, dtype, decisive)


def _save(
    model_class: Any,
    config: Any,
    directory: Path | str,
    seed: int,
    init_std: float,
    max_shard_size: str | None,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # fork_rng keeps the caller's global RNG stream untouched by model construction.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                noise = torch.randn(parameter.shape, generator=generator)
                if "norm" in name:
                    # Norm weights away from 1 so a model that skipped them would differ.
                    parameter.copy_(1.0 + 0.1 * noise)
                elif name.endswith(".bias"):
                    parameter.copy_(0.1 * noise)
                else:
                    parameter.copy_(init_std * noise)
            if decisive:
                make_decisive(model, generator)
    extra = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.to(dtype).save_pretrained(directory, **extra)
    return directory


def make_decisive(model: Any, generator: torch.Generator) -> None:
    """Reshapes a random model's embeddings and LM head so each next token leads the runner-up
    by units, as a trained model's usually does, instead of the near-ties of random weights that
    bfloat16 rounding flips: embeddings wide enough to dominate the residual stream, and the
    head row of token `order[t]` along token t's embedding, `order` a random permutation so
    greedy decoding walks through many tokens. The layers still add their (smaller) share."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    if head.data_ptr() == embed.data_ptr():
        raise ValueError(
            "a decisive checkpoint needs untied embeddings (tie_word_embeddings=False)"
        )
    embed.mul_(DECISIVE_EMBED_GAIN)
    order = torch.randperm(embed.shape[0], generator=generator)
    # A unit direction meets the final norm's output (length ~ sqrt(hidden)) in the top logit.
    unit = embed / embed.norm(dim=-1, keepdim=True)
    head[order] = DECISIVE_TOP_LOGIT / embed.shape[1] ** 0.5 * unit
