"""Stepping an engine until it is idle and collecting each request's channel items."""

from __future__ import annotations

from domain.engine import Engine
from domain.engine_request import EngineRequest
from domain.outputs import RequestEnd

# Far more steps than any test's requests need: past it the engine is wedged, not busy.
MAX_STEPS = 10_000


def drain(engine: Engine, requests: list[EngineRequest]) -> dict[str, list]:
    """Submits every request, steps until idle, and returns each one's channel items.

    Each request must have ended without an error, within MAX_STEPS steps.
    """
    channels = {r.request_id: engine.submit(r) for r in requests}
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            break
        engine.step()
    assert not engine.has_work(), f"the engine still had work after {MAX_STEPS} steps"
    found = {}
    for request_id, channel in channels.items():
        items = []
        while (item := channel.get_nowait()) is not None:
            items.append(item)
        assert isinstance(items[-1], RequestEnd) and items[-1].error is None, items[-1]
        found[request_id] = items
    return found
