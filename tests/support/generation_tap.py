"""Watches what a served engine really generated: each request's prompt IDs and every choice's
token IDs, forced and reasoning tokens included, which the wire does not show."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from domain.emission.outputs import ChoiceDelta, RequestEnd
from domain.engine.engine import Engine


@dataclass
class Generation:
    """One engine request as its channel received it: choices by index."""

    prompt: tuple[int, ...]
    n: int
    tokens: dict[int, list[int]] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    ended: bool = False


class GenerationTap:
    """Wraps `engine.submit_all` so every channel it is given reports to this tap as well; the
    requests are kept in arrival order until `take` hands them over."""

    def __init__(self, engine: Engine) -> None:
        self._lock = threading.Lock()
        self._seen: list[Generation] = []
        submit_all = engine.submit_all

        def tapped(submissions):
            for checked, channel in submissions:
                channel.put = self._listening(checked.request, channel.put)
            return submit_all(submissions)

        engine.submit_all = tapped  # type: ignore[method-assign]

    def _listening(self, request, put):
        generation = Generation(tuple(request.prompt_token_ids), request.n)
        with self._lock:
            self._seen.append(generation)

        def listening(item) -> None:
            if isinstance(item, ChoiceDelta):
                generation.tokens.setdefault(item.index, []).extend(item.token_ids)
                generation.texts[item.index] = generation.texts.get(item.index, "") + item.text
            elif isinstance(item, RequestEnd):
                generation.error = None if item.error is None else str(item.error)
                generation.ended = True
            put(item)

        return listening

    def take(self) -> list[Generation]:
        """The requests submitted since the last `take`, oldest first."""
        with self._lock:
            taken, self._seen = self._seen, []
        return taken
