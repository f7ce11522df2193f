"""Vocabulary-sharded generation logprobs as six prepared Triton launches around two exchanges."""

from __future__ import annotations

import torch

from adapters.gpu.logprobs.custom_op_vp import vocab_parallel_operators
from adapters.gpu.logprobs.keys import CANDIDATES_PER_TILE
from adapters.gpu.logprobs.reducer import ReductionInputs
from adapters.gpu.logprobs.reference_reducer_vp import EXCHANGE_WORDS, ShardedReducer


class TritonVocabParallelLogprobReducer(ShardedReducer):
    """The torch-staged vocabulary-parallel contract from six Triton launches per rank.

    Launches: shard tile statistics, exchange 1 packing, the global normalization, shard tile
    candidates, exchange 2 packing and the final merge. No host synchronization chooses rows:
    every row of the shard gets programs, a row whose slot has a zero flag stops after reading
    its flag, and each exchange carries all R rows (a non-requesting row's words are whatever
    its workspace holds and no rank reads them). Workspaces are kept for the largest row count
    seen; logits never travel. The launches run as the three `vocab_parallel_operators`, the
    eager all-gathers between them.
    """

    _workspace: dict[str, torch.Tensor] | None = None  # sized by the first `_reserved`

    @property
    def tiles(self) -> int:
        """Whole normalizer tiles in this rank's shard."""
        return self.shard.tiles[self.shard.rank]

    @property
    def _stats_tiles(self) -> int:
        # An empty shard still runs one gated tile of no lanes, so every launch has a grid.
        return max(self.tiles, 1)

    def reserve(self, capacity: int, device: torch.device | str) -> None:
        """Allocates the workspaces and exchange buffers for up to `capacity` rows, and registers
        the custom ops, so that nothing is allocated or registered while a graph is captured."""
        self._reserved(capacity, device)

    def _reserved(self, capacity: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The workspaces, allocated first if they hold fewer rows or live elsewhere."""
        vocab_parallel_operators()
        device = torch.empty(0, device=device).device
        workspace = self._workspace
        if (
            workspace is not None
            and workspace["lse"].shape[0] >= capacity
            and workspace["lse"].device == device
        ):
            return workspace
        rows = max(capacity, 1)
        peer_words = rows * EXCHANGE_WORDS
        # Where each global tile's pair lies in the gathered words, in global tile order.
        tile_words = [
            peer * peer_words + 2 * tile
            for peer, tiles in enumerate(self.shard.tiles)
            for tile in range(tiles)
        ]
        self._workspace = {
            "stats": torch.empty(rows, self._stats_tiles, 2, dtype=torch.float32, device=device),
            "keys": torch.empty(
                rows, self._stats_tiles, CANDIDATES_PER_TILE, dtype=torch.int64, device=device
            ),
            "lse": torch.empty(rows, dtype=torch.float32, device=device),
            # Zeroed once, so the words of rows that never requested are deterministic.
            "send": torch.zeros(rows, EXCHANGE_WORDS, dtype=torch.int32, device=device),
            "received": torch.zeros(
                self.shard.world_size, rows, EXCHANGE_WORDS, dtype=torch.int32, device=device
            ),
            "tile_words": torch.tensor(tile_words, dtype=torch.int64, device=device),
            "stops": torch.tensor(self.shard.stops, dtype=torch.int64, device=device),
        }
        return self._workspace

    def reduce(self, inputs: ReductionInputs) -> None:
        """Same contract as VocabParallelLogprobReducer.reduce; both exchanges carry all rows."""
        shard = self.shard
        self._check(inputs)
        logits_shard, slots, positions, chosen, requested, counts, token_ids, out = inputs
        rows = logits_shard.shape[0]
        if rows == 0:
            return
        shard.check_group(self.collectives.group, "reducer")
        if logits_shard.stride(1) != 1:
            logits_shard = logits_shard.contiguous()
        space = self._reserved(rows, logits_shard.device)
        operators = vocab_parallel_operators()
        width = shard.width
        send, received = space["send"], space["received"]
        operators.statistics(logits_shard, slots, requested, space["stats"], send, width)
        self._gather(send, received, rows)
        operators.candidates(
            logits_shard, slots, chosen, requested, counts, token_ids, received,
            space["tile_words"], space["lse"], space["keys"], send, shard.start, width,
        )  # fmt: skip
        self._gather(send, received, rows)
        operators.merge(
            received[:, :rows], space["stops"], slots, positions, chosen, requested, counts,
            token_ids, space["lse"], out, shard.vocab_size, self.top_k,
        )  # fmt: skip

    def _gather(self, send: torch.Tensor, received: torch.Tensor, rows: int) -> None:
        """All-gathers the first `rows` rows of every rank's words into `received`, in rank order.

        The words travel as FP32 and only copies touch them, so bit-cast keys arrive unchanged.
        """
        slabs = [received[peer, :rows].view(torch.float32) for peer in range(self.shard.world_size)]
        self.collectives.all_gather_into(slabs, send[:rows].view(torch.float32), "logprobs")
