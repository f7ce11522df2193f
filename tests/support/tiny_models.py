"""Builders of tiny random transformers checkpoints (config.json + safetensors) for tests."""

from __future__ import annotations

from collections.abc import Mapping
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
_SPECIAL_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}
# Llama, Qwen2 and Mistral: untied unless asked.
_CLASSIC = {
    **_SHAPE,
    "max_position_embeddings": 512,
    **_SPECIAL_TOKENS,
    "tie_word_embeddings": False,
}


def build_tiny(
    architecture: str,
    directory: Path | str,
    settings: Mapping[str, Any],
    *,
    vocab_size: int = 384,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
    dtype: torch.dtype = torch.float32,
    decisive: bool = False,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """Writes a random transformers `architecture` (e.g. "LlamaForCausalLM") configured by
    `settings` with `overrides` on top, and returns its directory. Every builder here and in
    tiny_moe_models.py is this with its own settings.

    Weights: `init_std` Gaussian noise, norms 1 + 0.1 noise (so a model that skipped them would
    differ), biases 0.1 noise, all drawn from `seed`; `decisive` reshapes the embeddings and head
    (`make_decisive`). Saved in `dtype`, in shards of `max_shard_size` if given."""
    import transformers

    model_class = getattr(transformers, architecture)
    config = model_class.config_class(vocab_size=vocab_size, **{**settings, **overrides})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # fork_rng keeps the caller's global RNG stream untouched by model construction.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            # Saved buffers too (DeepSeek-V3's router keeps its score correction bias in one).
            saved = model.state_dict().keys()
            buffers = [(name, b) for name, b in model.named_buffers() if name in saved]
            for name, tensor in [*model.named_parameters(), *buffers]:
                if not tensor.is_floating_point() or "rotary" in name:
                    continue
                noise = torch.randn(tensor.shape, generator=generator)
                if "norm" in name:
                    tensor.copy_(1.0 + 0.1 * noise)
                elif "bias" in name:
                    tensor.copy_(0.1 * noise)
                else:
                    tensor.copy_(init_std * noise)
            if decisive:
                make_decisive(model, generator)
    extra = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.to(dtype).save_pretrained(directory, **extra)
    return directory


def build_tiny_llama(directory: Path | str, **options: Any) -> Path:
    """A random `LlamaForCausalLM` (GQA: 4 query heads, 2 key/value heads); `options` as
    `build_tiny`'s, config fields included (e.g. `rope_parameters`, `num_hidden_layers`)."""
    return build_tiny("LlamaForCausalLM", directory, _CLASSIC, **options)


def build_tiny_qwen2(directory: Path | str, **options: Any) -> Path:
    """A random `Qwen2ForCausalLM` (q/k/v biases randomised too); `options` as `build_tiny`'s."""
    return build_tiny("Qwen2ForCausalLM", directory, _CLASSIC, **options)


def build_tiny_mistral(directory: Path | str, **options: Any) -> Path:
    """A random `MistralForCausalLM`, without a sliding window unless `sliding_window` is given;
    `options` as `build_tiny`'s."""
    return build_tiny(
        "MistralForCausalLM", directory, {**_CLASSIC, "sliding_window": None}, **options
    )


def build_tiny_qwen3(directory: Path | str, **options: Any) -> Path:
    """A random `Qwen3ForCausalLM` (per-head q/k norms; head_dim 32, not hidden/heads)."""
    settings = {**_SHAPE, "head_dim": 32, "max_position_embeddings": 512}
    return build_tiny("Qwen3ForCausalLM", directory, {**settings, **_SPECIAL_TOKENS}, **options)


def build_tiny_phi3(directory: Path | str, **options: Any) -> Path:
    """A random `Phi3ForCausalLM` (fused qkv_proj and gate_up_proj) with longrope scaling:
    16 positions of pretraining (`original_max_position_embeddings`), distinct short and long
    factors."""
    half = _SHAPE["hidden_size"] // _SHAPE["num_attention_heads"] // 2
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10_000.0,
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.5 + 0.75 * i for i in range(half)],
    }
    settings = {
        **_SHAPE,
        "max_position_embeddings": 128,
        "rope_parameters": rope,
        "original_max_position_embeddings": 16,
        **_SPECIAL_TOKENS,
        "pad_token_id": None,
    }
    return build_tiny("Phi3ForCausalLM", directory, settings, **options)


def build_tiny_gemma3(directory: Path | str, **options: Any) -> Path:
    """A random `Gemma3ForCausalLM`: six layers (five sliding-window layers of window 8
    and one global, llama.cpp's fixed pattern), head_dim 32, logits soft-capped at 5."""
    settings = {
        **_SHAPE,
        "num_hidden_layers": 6,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 8,
        "final_logit_softcapping": 5.0,
        "max_position_embeddings": 512,
        "pad_token_id": 0,
        **_SPECIAL_TOKENS,
    }
    return build_tiny("Gemma3ForCausalLM", directory, settings, **options)


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
