"""One forward's inputs: token chunks of many sequences flattened, plus the attention layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceChunk:
    """The tokens one sequence feeds in one forward.

    The cache already holds this sequence's positions [0, start_position); `block_table` lists
    its KV block IDs in order and must cover start_position + len(token_ids) positions.
    """

    token_ids: tuple[int, ...]
    start_position: int
    block_table: tuple[int, ...]

    def __post_init__(self) -> None:
        # Lists are accepted for convenience; the stored value stays an immutable tuple.
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        object.__setattr__(self, "block_table", tuple(self.block_table))
        if not self.token_ids:
            raise ValueError("a chunk needs at least one token")
        if any(token_id < 0 for token_id in self.token_ids):
            raise ValueError("token IDs must not be negative")
        if self.start_position < 0:
            raise ValueError(f"start_position must not be negative, got {self.start_position}")
        if any(block_id < 0 for block_id in self.block_table):
            raise ValueError("block IDs must not be negative")

    @property
    def end_position(self) -> int:
        """One past the position of the chunk's last token."""
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True, eq=False)
class DecodeLayout:
    """Attention layout of the one-token chunks, attended in one batched call per layer."""

    rows: torch.Tensor  # int64 [B]: rows of the batch holding the decode tokens
    kv_slots: torch.Tensor  # int64 [B, L]: cache rows of positions 0..L-1, padding reads row 0
    query_positions: torch.Tensor  # int64 [B]
    visible: torch.Tensor  # bool [B, 1, 1, L]: key j exists for this sequence
    covers_all_rows: bool  # rows == arange(N), so no gather or scatter is needed


@dataclass(frozen=True, eq=False)
class PrefillLayout:
    """Attention layout of the multi-token chunks, padded to one [P, Q] query block."""

    query_rows: torch.Tensor  # int64 [P, Q]: rows of the batch; padding repeats a real row
    kv_slots: torch.Tensor  # int64 [P, K]: cache rows of positions 0..K-1, padding reads row 0
    query_positions: torch.Tensor  # int64 [P, Q]: padding queries sit at position 0
    visible: torch.Tensor  # bool [P, 1, Q, K]: causal within the sequence; padding sees key 0
    valid: torch.Tensor  # int64 [M]: flat indices into P * Q of the real queries, in row order
    valid_rows: torch.Tensor  # int64 [M]: the batch rows of those queries
    covers_all_rows: bool  # valid_rows == arange(N)
    fresh_rows: tuple[int, int] | None  # (first, stop) of a lone chunk starting at position 0


@dataclass(frozen=True, eq=False)
class ForwardBatch:
    """Every chunk of one forward, concatenated in chunk order (N rows in total).

    Chunks must belong to distinct sequences: each query sees only its own sequence's keys,
    which every layer writes before it attends. Gather indices and masks are built here once,
    on the host, so the layers never rebuild them or wait on the device.
    """

    input_ids: torch.Tensor  # int64 [N]
    positions: torch.Tensor  # int64 [N]
    slot_mapping: torch.Tensor  # int64 [N]: cache row receiving each token's key and value
    last_rows: torch.Tensor  # int64 [num_chunks]: row of each chunk's last token
    block_size: int
    chunk_lengths: tuple[int, ...]
    max_token_id: int
    max_block_id: int
    decode: DecodeLayout | None
    prefill: PrefillLayout | None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_lengths)

    @classmethod
    def build(
        cls, chunks: Sequence[SequenceChunk], block_size: int, device: torch.device | str
    ) -> ForwardBatch:
        """Flattens `chunks` and precomputes the decode and prefill attention layouts."""
        if not chunks:
            raise ValueError("a forward needs at least one chunk")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        for index, chunk in enumerate(chunks):
            if len(chunk.block_table) * block_size < chunk.end_position:
                raise ValueError(
                    f"chunk {index}: {len(chunk.block_table)} blocks of {block_size} cannot hold "
                    f"positions up to {chunk.end_position}"
                )
        lengths = [len(chunk.token_ids) for chunk in chunks]
        row_starts = [0]
        for length in lengths[:-1]:
            row_starts.append(row_starts[-1] + length)
        tables = _padded_block_tables(chunks)  # [C, max_blocks]
        chunk_of_row = torch.repeat_interleave(
            torch.arange(len(chunks)), torch.tensor(lengths, dtype=torch.int64)
        )
        positions = torch.tensor(
            [p for chunk in chunks for p in range(chunk.start_position, chunk.end_position)],
            dtype=torch.int64,
        )
        slot_mapping = _slots(tables[chunk_of_row], positions, block_size)
        input_ids = torch.tensor(
            [token_id for chunk in chunks for token_id in chunk.token_ids], dtype=torch.int64
        )
        last_rows = torch.tensor(
            [start + length - 1 for start, length in zip(row_starts, lengths, strict=True)],
            dtype=torch.int64,
        )
        decode_ids = [i for i, length in enumerate(lengths) if length == 1]
        prefill_ids = [i for i, length in enumerate(lengths) if length > 1]
        to_device = _Mover(device)
        flat = _Flattened(chunks, row_starts, tables, block_size, to_device)
        return cls(
            input_ids=to_device(input_ids),
            positions=to_device(positions),
            slot_mapping=to_device(slot_mapping),
            last_rows=to_device(last_rows),
            block_size=block_size,
            chunk_lengths=tuple(lengths),
            max_token_id=max(max(chunk.token_ids) for chunk in chunks),
            max_block_id=max((max(c.block_table) for c in chunks if c.block_table), default=-1),
            decode=_decode_layout(flat, decode_ids) if decode_ids else None,
            prefill=_prefill_layout(flat, prefill_ids) if prefill_ids else None,
        )


class _Mover:
    def __init__(self, device: torch.device | str) -> None:
        self._device = torch.device(device)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == self._device:
            return tensor
        return tensor.to(self._device, non_blocking=True)


def _padded_block_tables(chunks: Sequence[SequenceChunk]) -> torch.Tensor:
    width = max(1, max(len(chunk.block_table) for chunk in chunks))
    rows = [list(chunk.block_table) + [0] * (width - len(chunk.block_table)) for chunk in chunks]
    return torch.tensor(rows, dtype=torch.int64)


def _slots(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache rows of `positions` [R] or [R, L] given the block table of each of the R rows."""
    if positions.dim() == 1:
        return _slots(tables, positions[:, None], block_size)[:, 0]
    blocks = torch.gather(tables, 1, positions // block_size)
    return blocks * block_size + positions % block_size


@dataclass(frozen=True)
class _Flattened:
    """What both attention layouts read of a flattened batch."""

    chunks: Sequence[SequenceChunk]
    row_starts: list[int]
    tables: torch.Tensor  # [C, max_blocks]
    block_size: int
    to_device: _Mover

    def keys(
        self, ids: list[int], key_counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Key positions [L], which exist [n, L] for chunks `ids` holding `key_counts` keys,
        and their cache rows [n, L]."""
        width = int(key_counts.max())
        key_positions = torch.arange(width, dtype=torch.int64)
        exists = key_positions[None, :] < key_counts[:, None]
        # Missing keys read row 0 of the cache; the mask hides them.
        positions = key_positions.expand(len(ids), width)
        kv_slots = torch.where(exists, _slots(self.tables[ids], positions, self.block_size), 0)
        return key_positions, exists, kv_slots


def _decode_layout(flat: _Flattened, ids: list[int]) -> DecodeLayout:
    chunks, to_device = flat.chunks, flat.to_device
    key_counts = torch.tensor([chunks[i].end_position for i in ids], dtype=torch.int64)
    _, exists, kv_slots = flat.keys(ids, key_counts)  # [B, L]
    rows = torch.tensor([flat.row_starts[i] for i in ids], dtype=torch.int64)
    return DecodeLayout(
        rows=to_device(rows),
        kv_slots=to_device(kv_slots),
        query_positions=to_device(key_counts - 1),
        visible=to_device(exists[:, None, None, :]),
        covers_all_rows=len(ids) == len(chunks),
    )


def _prefill_layout(flat: _Flattened, ids: list[int]) -> PrefillLayout:
    chunks, row_starts, to_device = flat.chunks, flat.row_starts, flat.to_device
    lengths = torch.tensor([len(chunks[i].token_ids) for i in ids], dtype=torch.int64)
    starts = torch.tensor([chunks[i].start_position for i in ids], dtype=torch.int64)
    first_rows = torch.tensor([row_starts[i] for i in ids], dtype=torch.int64)
    query_index = torch.arange(int(lengths.max()), dtype=torch.int64)[None, :]  # [1, Q]
    real = query_index < lengths[:, None]  # [P, Q]
    query_rows = first_rows[:, None] + torch.minimum(query_index, lengths[:, None] - 1)
    query_positions = torch.where(real, starts[:, None] + query_index, 0)
    key_positions, _, kv_slots = flat.keys(ids, starts + lengths)  # [K], [P, K]
    visible = key_positions[None, None, :] <= query_positions[:, :, None]  # [P, Q, K]
    valid = torch.nonzero(real.flatten(), as_tuple=True)[0]
    valid_rows = query_rows.flatten()[valid]
    lone = chunks[ids[0]]
    fresh_rows = None
    if len(ids) == 1 and lone.start_position == 0:
        fresh_rows = (row_starts[ids[0]], row_starts[ids[0]] + len(lone.token_ids))
    return PrefillLayout(
        query_rows=to_device(query_rows),
        kv_slots=to_device(kv_slots),
        query_positions=to_device(query_positions),
        visible=to_device(visible[:, None, :, :]),
        valid=to_device(valid),
        valid_rows=to_device(valid_rows),
        covers_all_rows=len(ids) == len(chunks),
        fresh_rows=fresh_rows,
    )
