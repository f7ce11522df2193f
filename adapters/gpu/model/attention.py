"""Paged causal attention: write new keys/values, then attend over each sequence's cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from adapters.gpu.model.forward_batch import DecodeLayout, ForwardBatch, PrefillLayout
from adapters.gpu.model.invariant import blocked_attention


@dataclass(frozen=True, eq=False)
class AttentionMasks:
    """Masks of one forward for one sliding window (None: full causal), built once per forward.

    Query heads are folded onto their key/value head ([.., kv_heads, groups * Q, ..]) so grouped
    query attention never copies keys per query head; the prefill mask is folded to match.
    """

    decode: torch.Tensor | None  # bool [B, 1, 1, L]
    prefill: torch.Tensor | None  # bool [P, 1, groups * Q, K]; None on the fresh causal path
    prefill_is_fresh_causal: bool  # the lone chunk may use is_causal on its own new keys

    @classmethod
    def build(
        cls,
        batch: ForwardBatch,
        groups: int,
        sliding_window: int | None,
        allow_fresh: bool = True,
    ) -> AttentionMasks:
        """`allow_fresh=False` keeps a lone fresh prompt on the masked path that every other
        chunk takes (batch-invariant mode)."""
        decode_mask = prefill_mask = None
        fresh = False
        if batch.decode is not None:
            decode_mask = batch.decode.visible
            if sliding_window is not None:
                key_positions = torch.arange(decode_mask.shape[-1], device=decode_mask.device)
                earliest = batch.decode.query_positions[:, None, None, None] - sliding_window
                decode_mask = decode_mask & (key_positions > earliest)
        layout = batch.prefill
        if allow_fresh and layout is not None and layout.fresh_rows is not None:
            first, stop = layout.fresh_rows
            fresh = sliding_window is None or stop - first <= sliding_window
        if layout is not None and not fresh:
            mask = layout.visible  # [P, 1, Q, K]
            if sliding_window is not None:
                key_positions = torch.arange(mask.shape[-1], device=mask.device)
                earliest = layout.query_positions[:, None, :, None] - sliding_window
                mask = mask & (key_positions > earliest)
            count, _, queries, keys = mask.shape
            prefill_mask = (
                mask[:, :, None]
                .expand(count, 1, groups, queries, keys)
                .reshape(count, 1, groups * queries, keys)
            )
        return cls(decode=decode_mask, prefill=prefill_mask, prefill_is_fresh_causal=fresh)


def paged_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    batch: ForwardBatch,
    masks: AttentionMasks,
    scale: float,
    invariant: bool = False,
) -> torch.Tensor:
    """Stores this forward's keys/values in the cache and returns the attention output.

    queries [N, heads, head_dim]; keys, values [N, kv_heads, head_dim] (rotated already);
    caches [rows, kv_heads, head_dim]. Returns [N, heads * head_dim]. A query at position p
    of a sequence sees that sequence's keys at positions <= p (and inside the window).
    `invariant` attends every query through `blocked_attention` (masks built without the
    fresh path): bit for bit the same whatever shares the forward.
    """
    key_cache.index_copy_(0, batch.slot_mapping, keys)
    value_cache.index_copy_(0, batch.slot_mapping, values)
    num_rows, num_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    groups = num_heads // num_kv_heads
    decode_out = prefill_out = None
    cache = _PagedCache(key_cache, value_cache, groups, scale, invariant)
    if batch.decode is not None:
        decode_out = cache.decode(queries, batch.decode, _built(masks.decode))
        if batch.decode.covers_all_rows:
            return decode_out
    if batch.prefill is not None:
        if masks.prefill_is_fresh_causal:
            prefill_out = _fresh_causal(queries, keys, values, batch, scale)
        else:
            prefill_out = cache.prefill(queries, batch.prefill, _built(masks.prefill))
        if batch.prefill.covers_all_rows:
            return prefill_out
    output = queries.new_empty(num_rows, num_heads * head_dim)
    if decode_out is not None and batch.decode is not None:
        output.index_copy_(0, batch.decode.rows, decode_out)
    if prefill_out is not None and batch.prefill is not None:
        output.index_copy_(0, batch.prefill.valid_rows, prefill_out)
    return output


@dataclass(frozen=True)
class _PagedCache:
    """One layer's cached keys and values, attended by the decode rows or the prefill chunks."""

    keys: torch.Tensor
    values: torch.Tensor
    groups: int  # query heads per key/value head
    scale: float
    invariant: bool = False

    def decode(
        self, queries: torch.Tensor, layout: DecodeLayout, mask: torch.Tensor
    ) -> torch.Tensor:
        rows = queries if layout.covers_all_rows else queries.index_select(0, layout.rows)
        count, num_heads, head_dim = rows.shape
        # One query per row: its heads of a group become that group's query "sequence".
        folded = rows.view(count, num_heads // self.groups, self.groups, head_dim)
        out = self._attend(folded, layout.kv_slots, mask)  # keys [B, kv_heads, L, head_dim]
        return out.reshape(count, num_heads * head_dim)

    def prefill(
        self, queries: torch.Tensor, layout: PrefillLayout, mask: torch.Tensor
    ) -> torch.Tensor:
        groups = self.groups
        _, num_heads, head_dim = queries.shape
        num_kv_heads = num_heads // groups
        count, width = layout.query_rows.shape
        padded = queries.index_select(0, layout.query_rows.flatten())  # [P * Q, heads, head_dim]
        folded = (
            padded.view(count, width, num_kv_heads, groups, head_dim)
            .permute(0, 2, 3, 1, 4)
            .reshape(count, num_kv_heads, groups * width, head_dim)
        )
        out = self._attend(folded, layout.kv_slots, mask)  # keys [P, kv_heads, K, head_dim]
        unfolded = (
            out.view(count, num_kv_heads, groups, width, head_dim)
            .permute(0, 3, 1, 2, 4)
            .reshape(count * width, num_heads * head_dim)
        )
        return unfolded.index_select(0, layout.valid)

    def _attend(
        self, folded: torch.Tensor, kv_slots: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Folded queries [S, kv_heads, q, head_dim] over the cache rows `kv_slots` [S, L]."""
        if self.invariant:
            return blocked_attention(folded, self.keys, self.values, kv_slots, mask, self.scale)
        keys, values = _gather(self.keys, kv_slots), _gather(self.values, kv_slots)
        return F.scaled_dot_product_attention(
            folded, keys, values, attn_mask=mask, scale=self.scale
        )


def _built(mask: torch.Tensor | None) -> torch.Tensor:
    """The mask of a layout the batch has; masks built from another batch may lack it."""
    if mask is None:
        raise ValueError("the attention masks were built for another batch")
    return mask


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Cache rows `slots` [S, L] as [S, kv_heads, L, head_dim].

    index_select on the flattened slots is several times faster than advanced indexing on CPU.
    """
    count, width = slots.shape
    rows = cache.index_select(0, slots.flatten())
    return rows.view(count, width, *cache.shape[1:]).transpose(1, 2)


def _fresh_causal(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """A lone prompt starting at position 0 needs no cache read and no explicit mask."""
    layout = batch.prefill
    if layout is None or layout.fresh_rows is None:
        raise ValueError("the batch has no lone fresh prompt")
    first, stop = layout.fresh_rows
    span_queries = queries[first:stop].transpose(0, 1)[None]  # [1, heads, T, head_dim]
    span_keys = keys[first:stop].transpose(0, 1)[None]  # [1, kv_heads, T, head_dim]
    span_values = values[first:stop].transpose(0, 1)[None]
    grouped = span_queries.shape[1] != span_keys.shape[1]
    out = F.scaled_dot_product_attention(
        span_queries, span_keys, span_values, is_causal=True, scale=scale, enable_gqa=grouped
    )
    return out[0].transpose(0, 1).reshape(stop - first, -1)
