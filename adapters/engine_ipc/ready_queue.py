"""Request IDs the engine marks ready, for a writer thread that sleeps until some come."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


class ReadyQueue:
    """IDs put by one thread and taken in batches by one writer that waits on `condition`.

    `put` takes no lock while the writer is awake: taking the writer's lock for every channel
    had the engine thread wait on the writer, and the writer on the GIL, about 11 us a channel
    at 64 streams (bench/host.py profile). A deque's append needs none.

    The writer says it is going to sleep before it looks at the queue, and `put` looks at that
    after it appends. So either the writer sees the new ID, or `put` sees the writer asleep and
    wakes it under the lock. The flag it replaced meant "the writer was woken" and was set
    outside the lock. A writer could then drain and reset it between `put`'s test and its set,
    and sleep with the flag left up: no later `put` woke it, and that API process's streams
    stopped for good (seen once in about a hundred bench cells, 2026-12-04).
    """

    def __init__(self, condition: threading.Condition) -> None:
        self._condition = condition
        self._ids: deque[str] = deque()
        self._sleeping = False

    def put(self, request_id: str) -> None:
        """Queues an ID and wakes the writer if it sleeps (any thread; the engine's)."""
        self._ids.append(request_id)
        if self._sleeping:
            with self._condition:
                if self._sleeping:
                    # Cleared here, so the step's further IDs take no lock.
                    self._sleeping = False
                    self._condition.notify()

    def wait(self, closed: Callable[[], bool]) -> None:
        """Holding the condition: returns once IDs are queued or `closed()` is true."""
        self._sleeping = True  # before the test below: a put after it sees the flag
        while not self._ids and not closed():
            self._condition.wait()
            self._sleeping = True
        self._sleeping = False

    def drain(self) -> list[str]:
        """The queued IDs in order, each once, leaving the queue empty."""
        ready: dict[str, None] = {}
        ids = self._ids
        while ids:
            ready[ids.popleft()] = None
        return list(ready)
