"""One rank's collectives over its tensor-parallel group, each counted and failing loudly."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


class ParallelFailure(RuntimeError):
    """A collective failed: a peer rank died, hung past the timeout or broke the group.

    The group cannot be trusted afterwards, so every later call raises this too.
    """


@dataclass(slots=True)
class ExchangeTally:
    """Per purpose: how many collectives ran and how many 32-bit words this rank sent.

    Words count what this rank contributes (an all-gather's input, an all-reduce's tensor,
    a broadcast's tensor on every rank), so tests can prove what each exchange carries.
    """

    calls: Counter[str] = field(default_factory=Counter)
    words: Counter[str] = field(default_factory=Counter)
    # The widest row (words per row) any all-gather of this purpose carried.
    widest_row: Counter[str] = field(default_factory=Counter)

    def note(self, purpose: str, tensor: torch.Tensor, row_words: int = 0) -> None:
        self.calls[purpose] += 1
        self.words[purpose] += tensor.numel() * tensor.element_size() // 4
        self.widest_row[purpose] = max(self.widest_row[purpose], row_words)

    def clear(self) -> None:
        self.calls.clear()
        self.words.clear()
        self.widest_row.clear()


class Collectives:
    """All-reduce, all-gather and broadcast over `group` (None: the default group).

    Every call is counted in `tally` under its purpose. An exception from the backend (gloo
    raises on a closed connection or past the group's timeout) becomes a ParallelFailure and
    marks the collectives broken, so a failed rank never attempts another exchange.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.tally = ExchangeTally()
        self.failure: str | None = None

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def all_reduce(self, tensor: torch.Tensor, purpose: str, op: str = "sum") -> None:
        """Reduces `tensor` in place across the ranks (sum or max)."""
        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        self._run(purpose, tensor, 0, lambda: dist.all_reduce(tensor, reduce_op, group=self.group))

    def all_gather(self, words: torch.Tensor, purpose: str) -> torch.Tensor:
        """[n, w] of this rank -> [world, n, w] of every rank, in rank order (any 32-bit dtype)."""
        row_words = words.shape[-1] if words.dim() else 1
        received = [torch.empty_like(words) for _ in range(self.world_size)]
        self._run(
            purpose,
            words,
            row_words,
            lambda: dist.all_gather(received, words.contiguous(), group=self.group),
        )
        return torch.stack(received)

    def all_gather_into(
        self, received: list[torch.Tensor], words: torch.Tensor, purpose: str
    ) -> None:
        """The list form: received[r] gets rank r's `words`."""
        row_words = words.shape[-1] if words.dim() else 1
        self._run(
            purpose, words, row_words, lambda: dist.all_gather(received, words, group=self.group)
        )

    def all_gather_single(self, received: torch.Tensor, words: torch.Tensor, purpose: str) -> None:
        """The concatenated form: received holds every rank's `words`, in rank order."""
        row_words = words.shape[-1] if words.dim() else 1
        self._run(
            purpose,
            words,
            row_words,
            lambda: dist.all_gather_single(received, words, group=self.group),
        )

    def broadcast(self, tensor: torch.Tensor, purpose: str, source: int = 0) -> None:
        """Overwrites `tensor` on every rank with rank `source`'s."""
        self._run(purpose, tensor, 0, lambda: dist.broadcast(tensor, source, group=self.group))

    def _run(self, purpose: str, tensor: torch.Tensor, row_words: int, call) -> None:
        if self.failure is not None:
            raise ParallelFailure(self.failure)
        self.tally.note(purpose, tensor, row_words)
        try:
            call()
        except Exception as error:  # noqa: BLE001 - any backend error breaks the whole group
            self.failure = (
                f"tensor-parallel exchange {purpose!r} failed on rank {dist.get_rank()}: a peer "
                f"rank died, hung past the collective timeout or left the group ({error})"
            )
            raise ParallelFailure(self.failure) from error
