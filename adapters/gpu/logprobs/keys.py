"""Sort keys that rank reported logprobs, and the bit constants every reducer shares."""

from __future__ import annotations

import torch

from adapters.gpu.logprobs import native_reduction
from domain.logprobs.prompt_scores import INVALID_BITS

# The numbers below are plain Python ints, so the Triton kernels wrap these very values in
# tl.constexpr where they use them; nothing here imports triton.
CANDIDATES_PER_TILE = 32  # best keys a vocabulary tile (or a rank's shard) offers the final merge
LOW_WORD = 0xFFFFFFFF  # a key's low 32 bits hold LOW_WORD - token_id
NO_KEY = -(2**63)  # below every real key: a real key's low word is never zero
NEGATIVE_ZERO_BITS = -(2**31)  # int32 bits of -0.0, which ranks as +0.0
NAN_BITS = INVALID_BITS  # the quiet NaN torch writes for float("nan"), as invalid rows carry
_SPARE_CANDIDATES = 8


def order_keys(values: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """int64 sort keys of FP32 `values` and their IDs, equal to `domain.logprobs.values.sort_key`.

    Larger key = larger value, then smaller token ID; -0.0 ranks as +0.0.
    """
    bits = values.view(torch.int32)
    # Negative floats order backwards in their magnitude bits, so those bits are flipped.
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    ordered = ordered.masked_fill(bits == NEGATIVE_ZERO_BITS, 0)
    # Multiplying rather than shifting keeps negative high words well defined on every backend.
    return ordered.to(torch.int64) * (1 << 32) + (LOW_WORD - token_ids.to(torch.int64))


def key_token_ids(keys: torch.Tensor) -> torch.Tensor:
    """The int64 token ID each real sort key ranks."""
    return LOW_WORD - (keys & LOW_WORD)


def top_sort_keys(values: torch.Tensor, k: int, shifts: torch.Tensor | None = None) -> torch.Tensor:
    """The k largest `order_keys` of each row of FP32 `values` (all lanes real), descending;
    with `shifts` [n], of the values `values - shifts[:, None]` (one FP32 subtraction each).

    PERF: keys are built only for the best k + 8 values by float order. That set holds every
    value >= the k-th one unless the value at its end still equals the k-th (ties run past
    it); such rows fall back to keys over the whole row. The result is the same either way.
    CPU rows go through the compiled kernel when it is built (`native_reduction`), which
    subtracts the shifts as it reads, so the shifted rows are never written out.
    """
    fast = native_reduction.top_sort_keys(values, k, shifts)
    if fast is not None:
        return fast
    return torch_top_sort_keys(values if shifts is None else values - shifts[:, None], k)


def torch_top_sort_keys(values: torch.Tensor, k: int) -> torch.Tensor:
    """`top_sort_keys` by torch operations, on every device."""
    width = values.shape[1]
    candidates = min(width, k + _SPARE_CANDIDATES)
    best, best_ids = torch.topk(values, candidates, dim=1)
    keys = torch.topk(order_keys(best, best_ids), k, dim=1).values
    if candidates == width:
        return keys
    crowded = (best[:, -1] == best[:, k - 1]).nonzero().flatten()
    if crowded.numel():
        ids = torch.arange(width, dtype=torch.int64, device=values.device)
        full = order_keys(values.index_select(0, crowded), ids)
        keys[crowded] = torch.topk(full, k, dim=1).values
    return keys


def greater_counts(values: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """int32 [n]: how many lanes of each row of FP32 `values` [n, V] exceed its pivot [n].

    Equal values never count, nor does NaN on either side.
    """
    fast = native_reduction.count_greater(values, pivots)
    if fast is not None:
        return fast
    return (values > pivots[:, None]).sum(dim=1, dtype=torch.int32)
