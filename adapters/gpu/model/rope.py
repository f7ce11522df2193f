"""Rotary position embeddings: inverse frequencies for each scaling variant, and their use."""

from __future__ import annotations

import math
from typing import Any

import torch

from adapters.gpu.model.config import ModelConfig


def base_inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    """Plain RoPE: theta ** (-2i / head_dim) for i in [0, head_dim / 2), float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def inverse_frequencies(
    config: ModelConfig, context_length: int | None = None
) -> tuple[torch.Tensor, float]:
    """The static inverse frequencies [head_dim / 2] and the cos/sin multiplier.

    The dynamic (NTK) variant depends on the position; this returns its frequencies for
    positions inside the pretrained context, which are the plain ones. `context_length` is
    the longest sequence served (default: the config's max_position_embeddings); longrope
    picks its factor set by it (`longrope_inverse_frequencies`).
    """
    scaling = config.rope_scaling
    plain = base_inverse_frequencies(config.rope_theta, config.head_dim)
    if scaling is None:
        return plain, 1.0
    rope_type = scaling["rope_type"]
    if rope_type == "dynamic":
        return plain, 1.0
    if rope_type == "linear":
        return plain / scaling["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(plain, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(config, scaling)
    if rope_type == "longrope":
        return longrope_inverse_frequencies(
            config, context_length or config.max_position_embeddings
        )
    raise ValueError(f"unsupported rope_type {rope_type!r}")


def dynamic_ntk_inverse_frequencies(config: ModelConfig, positions: torch.Tensor) -> torch.Tensor:
    """Per-position frequencies [N, head_dim / 2] of dynamic NTK scaling.

    transformers grows the base with the longest sequence seen so far; decoding one token at a
    time, the token at position p is rotated with the base for length p + 1, which is what
    this computes for every position (so prefill and decode agree with each other).
    """
    if config.rope_scaling is None or config.rope_scaling["rope_type"] != "dynamic":
        raise ValueError("the config does not use dynamic NTK rope scaling")
    factor = float(config.rope_scaling["factor"])
    limit = config.max_position_embeddings
    dim = config.head_dim
    lengths = torch.clamp(positions.to(torch.float64) + 1.0, min=float(limit))
    bases = config.rope_theta * ((factor * lengths / limit) - (factor - 1.0)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device)
    exponents = exponents.to(torch.float32) / dim
    return 1.0 / (bases.to(torch.float32)[:, None] ** exponents[None, :])


def longrope_inverse_frequencies(
    config: ModelConfig, context_length: int
) -> tuple[torch.Tensor, float]:
    """Phi-3's longrope: plain frequencies divided per dimension by the short or the long
    factors, and the cos/sin multiplier (`attention_factor`, else transformers' default
    sqrt(1 + ln(factor) / ln(original)) for factor = max positions / original positions).

    transformers picks one factor set for a whole sequence: long when the sequence is longer
    than original_max_position_embeddings. A paged cache keeps keys rotated when written, so
    one set must hold for every sequence the server may hold: the long factors when
    `context_length` (the served --max-model-len) exceeds the original length, else the short.
    """
    scaling = config.rope_scaling
    if scaling is None or scaling["rope_type"] != "longrope":
        raise ValueError("the config does not use longrope scaling")
    original = int(scaling["original_max_position_embeddings"])
    chosen = scaling["long_factor"] if context_length > original else scaling["short_factor"]
    if len(chosen) != config.head_dim // 2:
        raise ValueError(
            f"longrope factors have {len(chosen)} entries for head_dim {config.head_dim}; "
            f"expected {config.head_dim // 2}"
        )
    factors = torch.tensor(chosen, dtype=torch.float32)
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64).to(torch.float32)
    inverse = 1.0 / (factors * config.rope_theta ** (exponents / config.head_dim))
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        factor = scaling.get("factor") or config.max_position_embeddings / original
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    return inverse, float(attention_factor)


def _llama3(plain: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelength = old_context / low_freq_factor
    high_freq_wavelength = old_context / high_freq_factor
    wavelength = 2 * math.pi / plain
    # Long wavelengths are interpolated by the factor, short ones kept, the band between blended.
    scaled = torch.where(wavelength > low_freq_wavelength, plain / factor, plain)
    blend = (old_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_band = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return torch.where(in_band, blended, scaled)


def _yarn(config: ModelConfig, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    dim = config.head_dim
    theta = config.rope_theta
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or config.max_position_embeddings / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor, 1.0)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def dimension_for(rotations: float) -> float:
        # The rotary dimension whose wavelength fits `rotations` times into the old context.
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_for(beta_fast), dimension_for(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    wavelengths = theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolated = 1.0 / wavelengths
    interpolated = 1.0 / (factor * wavelengths)
    return interpolated * (1 - keep) + extrapolated * keep, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


class RotaryEmbedding:
    """Turns token positions into cos/sin tables and rotates query and key heads.

    Follows the rotate-half convention: the head's first and second halves form the pairs.
    """

    def __init__(
        self,
        config: ModelConfig,
        device: torch.device,
        tabulated: bool = False,
        context_length: int | None = None,
    ) -> None:
        inv_freq, self._attention_scaling = inverse_frequencies(config, context_length)
        self._inv_freq = inv_freq.to(device)
        scaling = config.rope_scaling
        self._dynamic = scaling is not None and scaling["rope_type"] == "dynamic"
        self._config = config
        self._device = device
        # `tabulated`: every position's rows come from one table computed once, so a position's
        # bits never depend on where it sits in a batch (vectorised and scalar tails of sin and
        # cos may round differently).
        self._tabulated = tabulated
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and signed sin [N, 1, head_dim] for `positions` [N], cast to `dtype`.

        The sin table carries the minus sign of rotate-half on its first half, so a rotation is
        `x * cos + x.roll(half) * sin` with one fewer kernel than slicing and concatenating.
        """
        if self._tabulated:
            cos, signed_sin = self._table(dtype)
            return cos.index_select(0, positions), signed_sin.index_select(0, positions)
        return self._computed(positions, dtype)

    def _table(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if dtype not in self._tables:
            every = torch.arange(self._config.max_position_embeddings, device=self._device)
            self._tables[dtype] = self._computed(every, dtype)
        return self._tables[dtype]

    def _computed(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._dynamic:
            inv_freq = dynamic_ntk_inverse_frequencies(self._config, positions)
            angles = positions.to(torch.float32)[:, None] * inv_freq
        else:
            angles = positions.to(torch.float32)[:, None] * self._inv_freq[None, :]
        cos = angles.cos() * self._attention_scaling
        sin = angles.sin() * self._attention_scaling
        cos = torch.cat((cos, cos), dim=-1).to(dtype)
        signed_sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, None, :], signed_sin[:, None, :]


def apply_rotary(heads: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotates `heads` [N, num_heads, head_dim] by the tables from `RotaryEmbedding.cos_sin`."""
    half = heads.shape[-1] // 2
    return heads * cos + heads.roll(half, dims=-1) * signed_sin
