"""The completion bundle: two record frames, the packed logprob output and its request inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.gpu.distributed.collectives import Collectives
from adapters.gpu.distributed.split import RankSplit
from adapters.gpu.logprobs.reducer import LogprobReducer, ReductionInputs
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer
from adapters.gpu.logprobs.reference_reducer_vp import VocabParallelLogprobReducer
from domain.contract.frames import FrameResult
from domain.contract.geometry import ExecutorGeometry
from domain.contract.records import HEADER_WORDS, CompletionRecord
from domain.engine.step import SlotWork
from domain.logprobs.values import (
    MAX_SELECTED_IDS,
    PositionLogprobs,
    unpack_position_bytes,
)


@dataclass(frozen=True, slots=True)
class LogprobBuffers:
    """The logprob part of the bundle; the ID inputs exist only in full cores."""

    logprobs: torch.Tensor  # int32 [frame, slot, position, words]
    requested: torch.Tensor  # int32 [capacity]
    token_ids: torch.Tensor | None  # int32 [capacity, 128]
    counts: torch.Tensor | None  # int32 [capacity]


@dataclass(frozen=True, slots=True)
class _FrameRequests:
    """Kept with a pending frame: which lanes requested logprobs and how many pairs each reads."""

    lanes: tuple[int, ...]
    pairs: dict[int, int]
    width: int  # W = max(K, the frame's largest selected-ID count)


class CompletionOutputs:
    """Owns `completion_records` int64[2, capacity, 16+T] and, when the core declares them,
    `completion_logprobs` int32[2, capacity, T, 2+2A], `logprob_requested` int32[capacity] and
    the selected-ID inputs `logprob_token_ids` int32[capacity, 128] and
    `logprob_token_id_counts` int32[capacity].

    Upload rules (the seed): the full flag and count vectors are written on every submission that
    samples, clearing unused slots; selecting slots also get their ID prefix; only lanes of that
    submission set flags. Submissions that sample nothing get neither flags nor transfers.
    """

    def __init__(
        self,
        geometry: ExecutorGeometry,
        device: torch.device,
        backend: str = "reference",
        *,
        split: RankSplit | None = None,
        collectives: Collectives | None = None,
    ) -> None:
        capacity, tokens = geometry.capacity, geometry.token_capacity
        self._geometry = geometry
        self._device = device
        self._top_k = geometry.logprobs.top_k
        # The logits lanes this rank reduces: the vocabulary, or its shard of it.
        self._width = geometry.vocab_size if split is None else split.vocab[1] - split.vocab[0]
        self._records = torch.zeros((2, capacity, HEADER_WORDS + tokens), dtype=torch.int64)
        # Host memory always: written and read through numpy, a third of torch's cost per
        # indexed copy of 64 lists (35 against 99 us a step to write, 13 against 28 to read).
        self._record_words = self._records.numpy()
        self._lanes: list[tuple[int, ...]] = [(), ()]
        self._requests: list[_FrameRequests | None] = [None, None]
        # The flags and counts the buffers hold (zeros, as allocated).
        self._uploaded = ([0] * capacity, [0] * capacity)
        self.buffers: LogprobBuffers | None = None
        if self._top_k:
            words = geometry.logprobs.position_words
            selects = geometry.logprobs.selects_ids
            self.buffers = LogprobBuffers(
                logprobs=torch.zeros(
                    (2, capacity, tokens, words), dtype=torch.int32, device=device
                ),
                requested=torch.zeros(capacity, dtype=torch.int32, device=device),
                token_ids=torch.zeros(
                    (capacity, MAX_SELECTED_IDS), dtype=torch.int32, device=device
                )
                if selects
                else None,
                counts=torch.zeros(capacity, dtype=torch.int32, device=device) if selects else None,
            )
            self._reducer = _reducer(backend, geometry.vocab_size, self._top_k, split, collectives)
            self._prepare(self.buffers)

    def _prepare(self, buffers: LogprobBuffers) -> None:
        """Sizes the reducer's workspaces and runs it once on a scratch frame, so any kernel
        compilation happens at start-up (before capture), never while serving: with and
        without the ID inputs, since `reduce` leaves them out of steps where no slot selects."""
        self._reducer.reserve(self._geometry.capacity, self._device)
        logits = torch.zeros((1, self._width), dtype=torch.float32, device=self._device)
        scratch = torch.zeros_like(buffers.logprobs[0])
        requested = torch.zeros_like(buffers.requested)
        requested[0] = 1
        zero = torch.zeros(1, dtype=torch.int64, device=self._device)
        id_inputs: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)]
        if buffers.counts is not None:
            id_inputs.append((torch.zeros_like(buffers.counts), buffers.token_ids))
        for counts, token_ids in id_inputs:
            heads = (logits, zero, zero, zero, requested)
            self._reducer.reduce(ReductionInputs(*heads, counts, token_ids, scratch))

    def upload(self, frame: int, sampling: list[SlotWork]) -> bool:
        """Writes this submission's flags, counts and ID prefixes; True if any lane requests."""
        buffers = self.buffers
        if buffers is None:
            return False
        requesting = [
            (w.slot, w.sampling.logprobs) for w in sampling if w.sampling.logprobs is not None
        ]
        flags = [0] * self._geometry.capacity
        counts = [0] * self._geometry.capacity
        for slot, options in requesting:
            flags[slot] = 1
            if options.token_ids and buffers.token_ids is not None:
                counts[slot] = len(options.token_ids)
                ids = torch.tensor(options.token_ids, dtype=torch.int32)
                buffers.token_ids[slot, : len(ids)].copy_(ids)
        # Only `upload` writes these buffers, so a step that asks what the last one asked
        # (the usual case: the same lanes running on) copies nothing. Each small copy gives the
        # GIL away, and the overlapped loop's worker waited up to a turn to get it back.
        if flags != self._uploaded[0]:
            buffers.requested.copy_(torch.tensor(flags, dtype=torch.int32))
        if buffers.counts is not None and counts != self._uploaded[1]:
            buffers.counts.copy_(torch.tensor(counts, dtype=torch.int32))
        self._uploaded = (flags, counts)
        # A lane decodes the pairs it asked for (none at K=0); the copy stays W wide.
        pairs = {slot: options.pairs for slot, options in requesting}
        width = max(self._top_k, *pairs.values()) if requesting else 0
        self._requests[frame] = _FrameRequests(tuple(pairs), pairs, width) if requesting else None
        return bool(requesting)

    def reduce(
        self,
        frame: int,
        logits: torch.Tensor,
        rows: list[int],
        slots: list[int],
        positions: list[int],
        chosen: list[int],
    ) -> None:
        """Reports emitted positions into the frame: row `rows[i]` of the raw `logits` is
        position `positions[i]` (among its record's emitted tokens) of slot `slots[i]`, which
        emitted `chosen[i]` there. Slots that did not request logprobs are skipped."""
        buffers = self.buffers
        if buffers is None:
            raise ValueError("this core has no logprob outputs")
        device = self._device

        def longs(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        # PERF: the usual step reduces every logits row in order; a copy of them would cost
        # the CPU more than the reduction (fresh pages every step).
        in_order = len(rows) == logits.shape[0] and rows == list(range(len(rows)))
        # With no slot selecting IDs (the host knows what it uploaded), the reducer skips the
        # selected-ID merge, whose pairs would all be the natural ones.
        selecting = any(self._uploaded[1])
        self._reducer.reduce(
            ReductionInputs(
                logits if in_order else logits.index_select(0, longs(rows)),
                longs(slots),
                longs(positions),
                longs(chosen),
                buffers.requested,
                buffers.counts if selecting else None,
                buffers.token_ids if selecting else None,
                buffers.logprobs[frame],
            )
        )

    def commit(self, frame: int, records: list[CompletionRecord]) -> None:
        """Encodes the lanes' records into the frame's ABI6 words, which `read` decodes.

        The synchronous loop reads each frame straight after submitting it; the overlapped
        loop (`--async-scheduling`) reads one frame while the next submission writes the other.
        """
        capacity = self._geometry.token_capacity
        slots = [record.slot for record in records]
        if records:
            words = [record.encode(capacity) for record in records]
            self._record_words[frame, slots] = words
        self._lanes[frame] = tuple(slots)

    def read(self, frame: int) -> FrameResult:
        """Decodes the frame's records and, for requesting lanes only, their emitted positions."""
        lanes, requests = self._lanes[frame], self._requests[frame]
        rows = self._record_words[frame, list(lanes)].tolist() if lanes else []
        records = tuple(CompletionRecord.decode(words) for words in rows)
        self._lanes[frame], self._requests[frame] = (), None
        if requests is None or self.buffers is None:
            return FrameResult(frame, records)
        width = 2 + 2 * requests.width
        slots = list(requests.lanes)
        words = self.buffers.logprobs[frame]
        tokens = words.shape[1]
        if words.device.type == "cpu":
            # Host memory already: read the frame in place. A gather here ran on torch's
            # intra-op threads and cost milliseconds a step on a busy 2-core host.
            data = words.numpy().data.cast("B")
            position_bytes = 4 * words.shape[2]
            first_byte = {slot: slot * tokens * position_bytes for slot in slots}
        else:
            # One copy of the requesting lanes' halves: chosen pair plus W alternative pairs.
            copied = words[slots, :, :width].cpu().contiguous()
            data = copied.numpy().data.cast("B")
            position_bytes = 4 * width
            first_byte = {slot: index * tokens * position_bytes for index, slot in enumerate(slots)}
        # Each lane unpacks only its emitted positions and, of each, only the pairs it asked
        # for, one call a position, straight from the bytes.
        logprobs: list[tuple[PositionLogprobs, ...] | None] = []
        for record in records:
            start = first_byte.get(record.slot)
            if start is None:
                logprobs.append(None)
                continue
            pairs = requests.pairs[record.slot]
            logprobs.append(
                tuple(
                    unpack_position_bytes(data, start + i * position_bytes, pairs)
                    for i in range(len(record.tokens))
                )
            )
        return FrameResult(
            frame, records, tuple(logprobs), payload_bytes=4 * len(slots) * tokens * width
        )


def _reducer(
    backend: str,
    vocab_size: int,
    top_k: int,
    split: RankSplit | None,
    collectives: Collectives | None,
) -> LogprobReducer:
    """Both backends write the same words; Triton's launches are prepared here, at start-up.

    A rank of a split model reduces its vocabulary shard through the two 256-word exchanges.
    """
    if backend not in ("triton", "reference"):
        raise ValueError(f"unknown logprobs backend {backend!r}")
    if split is not None:
        if backend == "triton":
            from adapters.gpu.logprobs.triton_reducer_vp import TritonVocabParallelLogprobReducer

            return TritonVocabParallelLogprobReducer(
                vocab_size, top_k, split.rank, split.world_size, collectives
            )
        return VocabParallelLogprobReducer(
            vocab_size, top_k, split.rank, split.world_size, collectives
        )
    if backend == "triton":
        # Imported only when chosen: triton is heavy and absent from some installs.
        from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer

        return TritonLogprobReducer(vocab_size, top_k)
    return ReferenceLogprobReducer(vocab_size, top_k)
