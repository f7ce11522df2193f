"""Stepping an engine until it is idle and collecting each request's channel items."""

from __future__ import annotations

from collections.abc import Collection

from domain.emission.outputs import RequestEnd
from domain.engine.engine import Engine
from domain.requests.engine_request import EngineRequest

# Far more steps than any test's requests need: past it the engine is wedged, not busy.
MAX_STEPS = 10_000


def drain(
    engine: Engine, requests: list[EngineRequest], failing: Collection[str] = ()
) -> dict[str, list]:
    """Submits every request, steps until idle, and returns each one's channel items.

    Each request must have ended within MAX_STEPS steps: with an error exactly when its ID is
    in `failing`.
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
        assert isinstance(items[-1], RequestEnd), items[-1]
        assert (items[-1].error is not None) == (request_id in failing), (request_id, items[-1])
        found[request_id] = items
    return found
