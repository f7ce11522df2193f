"""A bounded output channel from the engine thread to one request's consumer."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator

from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd
from domain.emission.rings import ReadyRings

Item = ChoiceDelta | PromptScores | RequestEnd


class OutputChannel:
    """Holds at most `capacity` items; the producer never blocks.

    When the consumer lags, a new delta merges into the newest queued delta of the same choice, so
    memory stays bounded by the request's own output and the engine thread never waits on a reader.
    """

    def __init__(self, capacity: int = 64, on_ready: Callable[[], None] | None = None) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self._capacity = capacity
        self._items: deque[Item] = deque()
        # A plain lock taken directly (C) on the hot paths, `put` and `get_nowait`, once per
        # token; the condition over it only for blocking `get`s, notified when one waits.
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiting = 0
        self._on_ready = on_ready
        self._rings: ReadyRings | None = None
        self._closed = False

    def ring_through(self, rings: ReadyRings) -> None:
        """From now on `on_ready` is called through `rings`: once a step, after its emission."""
        self._rings = rings

    def put(self, item: Item) -> None:
        with self._lock:
            if self._closed:
                return
            if not isinstance(item, RequestEnd) and len(self._items) >= self._capacity - 1:
                self._merge(item)
            else:
                self._items.append(item)
            if isinstance(item, RequestEnd):
                self._closed = True
            if self._waiting:
                self._ready.notify_all()
        if self._on_ready is not None:
            if self._rings is None:
                self._on_ready()
            else:
                self._rings.ring(self._on_ready)

    def _merge(self, item: ChoiceDelta | PromptScores) -> None:
        """Into the newest queued item of the same kind (and choice), keeping the order of kinds:
        prompt scores never merge past a queued delta, which they must precede."""
        for position in range(len(self._items) - 1, -1, -1):
            queued = self._items[position]
            if isinstance(item, PromptScores):
                if isinstance(queued, PromptScores) and position == len(self._items) - 1:
                    self._items[position] = queued.merge(item)
                    return
                break
            if isinstance(queued, ChoiceDelta) and queued.index == item.index:
                self._items[position] = queued.merge(item)
                return
        self._items.append(item)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get_nowait(self) -> Item | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def get(self, timeout: float | None = None) -> Item | None:
        with self._lock:
            if not self._items:
                self._waiting += 1
                try:
                    self._ready.wait(timeout)
                finally:
                    self._waiting -= 1
            return self._items.popleft() if self._items else None

    def __iter__(self) -> Iterator[Item]:
        while True:
            item = self.get()
            if item is None:
                continue
            yield item
            if isinstance(item, RequestEnd):
                return
