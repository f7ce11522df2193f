"""Physical request slots; each admission bumps the slot's epoch so stale records are ignored."""

from __future__ import annotations


class SlotTable:
    """A fixed set of slots `0..capacity-1` with a per-slot epoch counter."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._epochs = [0] * capacity
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def capacity(self) -> int:
        return len(self._epochs)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> tuple[int, int]:
        """Takes the lowest free slot and returns it with its new epoch."""
        if not self._free:
            raise ValueError("no free slot")
        slot = self._free.pop()
        self._epochs[slot] += 1
        return slot, self._epochs[slot]

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"slot {slot} is already free")
        self._free.append(slot)
        self._free.sort(reverse=True)
