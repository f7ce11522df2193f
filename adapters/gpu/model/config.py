"""The decoder's shape and numerics settings, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Architecture name -> the flavour of Llama-family decoder it describes.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}
_MODEL_TYPE_TO_ARCHITECTURE = {flavour: name for name, flavour in SUPPORTED_ARCHITECTURES.items()}
SUPPORTED_ROPE_TYPES = frozenset({"linear", "dynamic", "llama3", "yarn"})
DEFAULT_ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs to know about a checkpoint's shape.

    `rope_scaling` is None for plain RoPE, otherwise a dict whose `rope_type` is one of
    `SUPPORTED_ROPE_TYPES` (the other keys are that variant's parameters, HF spelling).
    `attention_bias` is the q/k/v projection bias; `output_bias` the o_proj bias.
    `sliding_windows` holds one entry per layer: None for full causal attention, W for a
    layer whose query at position p sees only keys at positions > p - W.
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
        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {hidden_act!r}; only 'silu' is supported")
        rope_theta, rope_scaling = _rope_settings(raw)
        if flavour == "qwen2":
            attention_bias, output_bias = True, False
        else:
            attention_bias = output_bias = bool(raw.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=_required(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(raw, "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or hidden_size // num_heads,
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


def _rope_settings(raw: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Merges the transformers 5 `rope_parameters` and the older `rope_scaling` spellings."""
    parameters = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if any(isinstance(value, dict) for value in parameters.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    theta = parameters.pop("rope_theta", None) or raw.get("rope_theta") or DEFAULT_ROPE_THETA
    rope_type = parameters.pop("rope_type", None) or parameters.pop("type", None) or "default"
    parameters.pop("type", None)
    partial = parameters.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {partial} is not supported")
    if rope_type == "default":
        return float(theta), None
    if rope_type in ("llama3", "yarn"):
        parameters.setdefault("original_max_position_embeddings", raw["max_position_embeddings"])
    return float(theta), {"rope_type": rope_type, **parameters}


def _sliding_windows(
    raw: Mapping[str, Any], flavour: str, num_layers: int
) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if flavour == "mistral":
        return (window,) * num_layers
    if flavour == "qwen2" and raw.get("use_sliding_window") and window:
        layer_types = raw.get("layer_types")
        if layer_types is None:
            first_sliding = raw.get("max_window_layers", num_layers)
            return tuple(window if i >= first_sliding else None for i in range(num_layers))
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    return (None,) * num_layers
