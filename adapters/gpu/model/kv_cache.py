"""The paged key/value cache: per layer, fixed-size blocks of cached key and value heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.gpu.model.config import ModelConfig


@dataclass(frozen=True, eq=False)
class PagedKVCache:
    """Per-layer key and value tensors [num_blocks * block_size, num_kv_heads, head_dim].

    Latent attention (DeepSeek) caches one compressed row per token and layer: `values` is
    then the very tuple of `keys` (rows [num_blocks * block_size, 1, cache_width]).

    Row `block_id * block_size + offset` holds the token at `offset` within that block. The
    tensors start zeroed: attention reads padded rows under a mask, and masked garbage such as
    NaN would still poison a softmax.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    num_blocks: int
    block_size: int

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive, got {self.num_blocks}, "
                f"{self.block_size}"
            )
        if len(self.keys) != len(self.values) or not self.keys:
            raise ValueError("a cache needs the same positive number of key and value layers")
        rows = self.num_blocks * self.block_size
        for tensor in (*self.keys, *self.values):
            if tensor.dim() != 3 or tensor.shape[0] != rows:
                raise ValueError(f"cache tensors must be [{rows}, kv_heads, head_dim]")

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> PagedKVCache:
        """Allocates zeroed blocks for every layer of `config`."""
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}"
            )
        shape = (num_blocks * block_size, config.num_key_value_heads, config.cache_width)
        layers = range(config.num_hidden_layers)
        keys = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in layers)
        # A latent-attention row is its own value (its first kv_lora_rank elements).
        shared = config.latent_attention is not None
        return cls(
            keys=keys,
            values=keys if shared else tuple(torch.zeros_like(key) for key in keys),
            num_blocks=num_blocks,
            block_size=block_size,
        )

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers, keys and values together (the one
        compressed row of latent attention)."""
        element_size = torch.empty((), dtype=dtype).element_size()
        tensors = 1 if config.latent_attention is not None else 2
        per_token = (
            tensors * config.num_hidden_layers * config.num_key_value_heads * config.cache_width
        )
        return per_token * element_size * block_size

    @staticmethod
    def blocks_for_budget(
        config: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype
    ) -> int:
        """How many whole blocks fit in `budget_bytes` (0 when not even one does)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must not be negative, got {budget_bytes}")
        return budget_bytes // PagedKVCache.bytes_per_block(config, block_size, dtype)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @property
    def device(self) -> torch.device:
        return self.keys[0].device
