"""The decoder's shape and numerics settings, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.gpu.model.moe_config import (
    MOE_ARCHITECTURES,
    ExpertsSettings,
    LatentAttentionSettings,
    experts_from_hf,
    latent_attention_from_hf,
)

# Architecture name -> the flavour of Llama-family decoder it describes (its model_type).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3_text",
    **MOE_ARCHITECTURES,
}
_MODEL_TYPE_TO_ARCHITECTURE = {flavour: name for name, flavour in SUPPORTED_ARCHITECTURES.items()}
SUPPORTED_ROPE_TYPES = frozenset({"linear", "dynamic", "llama3", "yarn", "longrope"})
SUPPORTED_ACTIVATIONS = frozenset({"silu", "gelu_pytorch_tanh"})
DEFAULT_ROPE_THETA = 10_000.0
# Gemma 3's defaults when config.json leaves them out (transformers' Gemma3TextConfig).
_GEMMA3_GLOBAL_THETA = 1_000_000.0
_GEMMA3_LOCAL_THETA = 10_000.0
_GEMMA3_SLIDING_PATTERN = 6


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs to know about a checkpoint's shape.

    `rope_scaling` is None for plain RoPE, otherwise a dict whose `rope_type` is one of
    `SUPPORTED_ROPE_TYPES` (the other keys are that variant's parameters, HF spelling).
    `attention_bias` is the q/k/v projection bias; `output_bias` the o_proj bias.
    `sliding_windows` holds one entry per layer: None for full causal attention, W for a
    layer whose query at position p sees only keys at positions > p - W.

    The remaining fields describe the families beyond Llama, each off by default:
    `qk_norm` RMS-normalises every query and key head before the rotation (Qwen3, Gemma 3);
    `norm_weight_offset` is added to every checkpoint norm weight, and the norm is then scaled
    in float32 (Gemma's `1 + w`); `sandwich_norms` also normalises the attention and MLP outputs
    before their residual adds (Gemma 3); `embedding_multiplier` scales the embedding rows (in
    the model dtype); `attention_multiplier` replaces head_dim ** -0.5 as the query scale;
    `final_logit_softcapping` caps logits as cap * tanh(logit / cap); `local_rope_theta` is the
    plain-RoPE base of the sliding-window layers (Gemma 3), which otherwise share the rope of
    the global ones.
    `experts` routes the MLP of sparse layers (mixture of experts, `docs/moe.md`);
    `latent_attention` replaces the attention with DeepSeek's latent form, whose cache holds one
    [1, cache_width] row per token (then `num_key_value_heads` is 1 and `head_dim` the rotary
    width).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    sliding_windows: tuple[int | None, ...] = field(default=())
    hidden_act: str = "silu"
    qk_norm: bool = False
    norm_weight_offset: float = 0.0
    sandwich_norms: bool = False
    embedding_multiplier: float | None = None
    attention_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    local_rope_theta: float | None = None
    experts: ExpertsSettings | None = None
    latent_attention: LatentAttentionSettings | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(_unsupported_message(self.architecture))
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type")
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"unsupported rope_type {rope_type!r}; supported: default, "
                    + ", ".join(sorted(SUPPORTED_ROPE_TYPES))
                )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_act {self.hidden_act!r}; supported: "
                + ", ".join(sorted(SUPPORTED_ACTIVATIONS))
            )
        for name in ("embedding_multiplier", "attention_multiplier", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        if self.local_rope_theta is not None and not self.local_rope_theta > 0:
            raise ValueError(f"local_rope_theta must be positive, got {self.local_rope_theta}")
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_hidden_layers)
        if len(self.sliding_windows) != self.num_hidden_layers:
            raise ValueError(
                f"sliding_windows has {len(self.sliding_windows)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        for window in self.sliding_windows:
            if window is not None and (not isinstance(window, int) or window <= 0):
                raise ValueError(f"a sliding window must be a positive integer, got {window!r}")
        if self.experts is not None and len(self.experts.sparse_layers) != self.num_hidden_layers:
            raise ValueError("the experts settings describe another number of layers")
        if self.latent_attention is not None and self.num_key_value_heads != 1:
            raise ValueError("latent attention caches one shared key/value row per token")

    @property
    def cache_width(self) -> int:
        """Elements per cached key (and value) row of one key/value head."""
        if self.latent_attention is not None:
            return self.latent_attention.cache_width
        return self.head_dim

    @property
    def num_query_groups(self) -> int:
        """Query heads sharing one key/value head (1 without GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dir(cls, path: Path | str) -> ModelConfig:
        """Reads `config.json` from a Hugging Face checkpoint directory."""
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"no config.json in {Path(path)}")
        try:
            with config_path.open(encoding="utf-8") as handle:
                raw = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{config_path} is not valid JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{config_path} does not hold a JSON object")
        try:
            return cls.from_hf_dict(raw)
        except (ValueError, TypeError, KeyError) as error:
            # The message says what is wrong; the path says where.
            raise ValueError(f"{config_path}: {error}") from None

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from the parsed contents of a Hugging Face `config.json`."""
        architecture = _architecture_of(raw)
        flavour = SUPPORTED_ARCHITECTURES[architecture]
        hidden_size = _required(raw, "hidden_size")
        num_heads = _required(raw, "num_attention_heads")
        num_layers = _required(raw, "num_hidden_layers")
        hidden_act = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
        if hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_act {hidden_act!r}; supported: "
                + ", ".join(sorted(SUPPORTED_ACTIVATIONS))
            )
        if flavour == "gemma3_text":
            rope_theta, rope_scaling, local_theta = _gemma3_rope_settings(raw)
        else:
            rope_theta, rope_scaling = _rope_settings(raw, flavour)
            local_theta = None
        if flavour == "qwen2":
            attention_bias, output_bias = True, False
        elif flavour == "qwen2_moe":
            attention_bias, output_bias = bool(raw.get("qkv_bias", True)), False
        else:
            attention_bias = output_bias = bool(raw.get("attention_bias", False))
        latent = None
        kv_heads = raw.get("num_key_value_heads") or num_heads
        head_dim = raw.get("head_dim") or hidden_size // num_heads
        if flavour == "deepseek_v3":
            latent = latent_attention_from_hf(raw, rope_scaling)
            kv_heads, head_dim = 1, latent.rope_dim
        return cls(
            architecture=architecture,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_required(raw, "max_position_embeddings"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            output_bias=output_bias,
            mlp_bias=flavour == "llama" and bool(raw.get("mlp_bias", False)),
            eos_token_ids=_token_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            sliding_windows=_sliding_windows(raw, flavour, num_layers),
            hidden_act=hidden_act,
            local_rope_theta=local_theta,
            **_family_settings(raw, flavour),
            experts=experts_from_hf(raw, flavour, num_layers),
            latent_attention=latent,
        )


def _unsupported_message(architecture: str) -> str:
    return f"unsupported model architecture {architecture!r}; supported: " + ", ".join(
        sorted(SUPPORTED_ARCHITECTURES)
    )


def _architecture_of(raw: Mapping[str, Any]) -> str:
    architectures = raw.get("architectures") or []
    if architectures:
        name = architectures[0]
    else:
        model_type = raw.get("model_type")
        if model_type not in _MODEL_TYPE_TO_ARCHITECTURE:
            raise ValueError(
                f"config.json names no architecture and its model_type {model_type!r} is not "
                "one of " + ", ".join(sorted(_MODEL_TYPE_TO_ARCHITECTURE))
            )
        name = _MODEL_TYPE_TO_ARCHITECTURE[model_type]
    if name not in SUPPORTED_ARCHITECTURES:
        raise ValueError(_unsupported_message(name))
    return name


def _required(raw: Mapping[str, Any], key: str) -> Any:
    if key not in raw or raw[key] is None:
        raise ValueError(f"config.json lacks required field {key!r}")
    return raw[key]


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(token_id) for token_id in value)


def _family_settings(raw: Mapping[str, Any], flavour: str) -> dict[str, Any]:
    """The ModelConfig fields of the Qwen3 and Gemma 3 layer shapes."""
    if flavour in ("qwen3", "qwen3_moe"):
        return {"qk_norm": True}
    if flavour != "gemma3_text":
        return {}
    if raw.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 with use_bidirectional_attention is not supported")
    if raw.get("attn_logit_softcapping") is not None:
        raise ValueError(
            "attn_logit_softcapping is not supported (Gemma 3 checkpoints leave it null)"
        )
    head_dim = raw.get("head_dim") or 256
    scalar = raw.get("query_pre_attn_scalar") or head_dim
    cap = raw.get("final_logit_softcapping")
    return {
        "qk_norm": True,
        "norm_weight_offset": 1.0,
        "sandwich_norms": True,
        "embedding_multiplier": float(_required(raw, "hidden_size")) ** 0.5,
        "attention_multiplier": float(scalar) ** -0.5,
        "final_logit_softcapping": None if cap is None else float(cap),
    }


def _gemma3_rope_settings(
    raw: Mapping[str, Any],
) -> tuple[float, dict[str, Any] | None, float]:
    """Global rope (theta, scaling) and the local layers' base, from either spelling: the
    transformers 5 `rope_parameters` per layer type, or `rope_theta`, `rope_scaling` and
    `rope_local_base_freq`."""
    parameters = raw.get("rope_parameters") or {}
    if "full_attention" in parameters or "sliding_attention" in parameters:
        full = dict(parameters.get("full_attention") or {})
        local = dict(parameters.get("sliding_attention") or {})
    else:
        full = dict(raw.get("rope_scaling") or parameters or {})
        full.setdefault("rope_theta", raw.get("rope_theta") or _GEMMA3_GLOBAL_THETA)
        local = {"rope_theta": raw.get("rope_local_base_freq") or _GEMMA3_LOCAL_THETA}
    full.setdefault("rope_theta", _GEMMA3_GLOBAL_THETA)
    local_type = local.get("rope_type") or local.get("type") or "default"
    if local_type != "default":
        raise ValueError(f"sliding-window layers with rope_type {local_type!r} are not supported")
    merged = {"rope_parameters": full, "max_position_embeddings": raw["max_position_embeddings"]}
    theta, scaling = _rope_settings(merged, "gemma3_text")
    return theta, scaling, float(local.get("rope_theta") or _GEMMA3_LOCAL_THETA)


def _rope_settings(
    raw: Mapping[str, Any], flavour: str = "llama"
) -> tuple[float, dict[str, Any] | None]:
    """Merges the transformers 5 `rope_parameters` and the older `rope_scaling` spellings."""
    parameters = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if any(isinstance(value, dict) for value in parameters.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    theta = parameters.pop("rope_theta", None) or raw.get("rope_theta") or DEFAULT_ROPE_THETA
    rope_type = parameters.pop("rope_type", None) or parameters.pop("type", None) or "default"
    parameters.pop("type", None)
    if flavour == "phi3" and rope_type in ("su", "yarn"):
        # transformers' Phi3Config reads both older names as longrope.
        rope_type = "longrope"
    partial = parameters.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {partial} is not supported")
    if rope_type == "default":
        return float(theta), None
    if rope_type == "longrope" and raw.get("original_max_position_embeddings"):
        # Phi-3 keeps the pretraining length beside rope_scaling; transformers prefers it.
        parameters["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
    if rope_type in ("llama3", "yarn", "longrope"):
        parameters.setdefault("original_max_position_embeddings", raw["max_position_embeddings"])
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            if not isinstance(parameters.get(key), list):
                raise ValueError(f"longrope rope scaling lacks its {key} list")
    return float(theta), {"rope_type": rope_type, **parameters}


def _sliding_windows(
    raw: Mapping[str, Any], flavour: str, num_layers: int
) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if flavour in ("mistral", "mixtral"):
        return (window,) * num_layers
    if flavour == "phi3":
        # One window (or none) for every layer; llama.cpp's GGUF writes 0 for none.
        return (window or None,) * num_layers
    if flavour == "gemma3_text":
        layer_types = raw.get("layer_types")
        if layer_types is None:
            pattern = raw.get("sliding_window_pattern") or _GEMMA3_SLIDING_PATTERN
            layer_types = [
                "sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(num_layers)
            ]
        if len(layer_types) != num_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if flavour == "qwen3_moe" and raw.get("use_sliding_window") and window:
        return (window,) * num_layers
    if flavour in ("qwen2", "qwen3", "qwen2_moe") and raw.get("use_sliding_window") and window:
        layer_types = raw.get("layer_types")
        if layer_types is None:
            first_sliding = raw.get("max_window_layers", num_layers)
            return tuple(window if i >= first_sliding else None for i in range(num_layers))
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    return (None,) * num_layers
