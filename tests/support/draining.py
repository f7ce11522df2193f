"""Stepping an engine until it is idle and collecting each request's channel items."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from typing import Any

from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd
from domain.engine.engine import Engine
from domain.requests.engine_request import EngineRequest

# Far more steps than any test's requests need: past it the engine is wedged, not busy.
MAX_STEPS = 10_000


def step_until_idle(
    engine: Engine, after_step: Callable[[], object] | None = None, max_steps: int = MAX_STEPS
) -> int:
    """Steps `engine` until it has no work and returns how many steps that took.

    Fails when it still has work after `max_steps` steps; `after_step` runs after each step.
    """
    for steps in range(max_steps + 1):
        if not engine.has_work():
            return steps
        if steps == max_steps:
            break
        engine.step()
        if after_step is not None:
            after_step()
    raise AssertionError(f"the engine still had work after {max_steps} steps")


def wait_until_idle(engine: Engine, timeout: float = 30.0) -> None:
    """Waits for an engine that a server's loop steps to go idle; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while engine.has_work():
        assert time.monotonic() < deadline, f"the engine still had work after {timeout} s"
        time.sleep(0.01)


def channel_items(channel) -> list:
    """Everything a request's output channel holds now, in order."""
    items = []
    while (item := channel.get_nowait()) is not None:
        items.append(item)
    return items


def drain(
    engine: Engine, requests: list[EngineRequest], failing: Collection[str] = ()
) -> dict[str, list]:
    """Submits every request, steps until idle, and returns each one's channel items.

    Each request must have ended within MAX_STEPS steps: with an error exactly when its ID is
    in `failing`.
    """
    channels = {r.request_id: engine.submit(r) for r in requests}
    step_until_idle(engine)
    return ended_items(channels, failing)


def ended_items(channels: dict, failing: Collection[str] = ()) -> dict[str, list]:
    """Each channel's items; each must end with a RequestEnd, erring exactly when in `failing`."""
    found = {}
    for request_id, channel in channels.items():
        items = channel_items(channel)
        assert items and isinstance(items[-1], RequestEnd), items[-1:]
        assert (items[-1].error is not None) == (request_id in failing), (request_id, items[-1])
        found[request_id] = items
    return found


def whole_outputs(items: list) -> tuple:
    """What the contract promises a request, from its channel items: each choice's whole
    output, the prompt's scores and the end. How tokens were grouped into deltas may follow the
    steps, and so may how many prompt tokens the prefix cache held at admission (zeroed)."""
    choices: dict[int, ChoiceDelta] = {}
    for item in items:
        if isinstance(item, ChoiceDelta):
            earlier = choices.get(item.index)
            choices[item.index] = item if earlier is None else earlier.merge(item)
    scores = [item for item in items if isinstance(item, PromptScores)]
    end = items[-1]
    assert isinstance(end, RequestEnd)
    end = dataclasses.replace(end, usage=dataclasses.replace(end.usage, cached_tokens=0))
    return tuple(sorted(choices.items())), scores, end


def logprob_records(items: list, ranks: bool = False) -> dict[str, list[Any]]:
    """A request's channel items as plain values to compare between runs: its generated
    `tokens`, each token's (id, logprob) `entries` (the chosen one first, then its
    alternatives), and each `prompt` score's (id, logprob), with its rank when `ranks`, followed
    by its alternatives."""
    found: dict[str, list[Any]] = {"tokens": [], "entries": [], "prompt": []}
    for item in items:
        if isinstance(item, ChoiceDelta):
            found["tokens"] += item.token_ids
            for entry in item.logprobs:
                position = entry.position
                found["entries"].append(
                    [(p.token_id, p.logprob) for p in (position.chosen, *position.alternatives)]
                )
        elif isinstance(item, PromptScores):
            for score in item.scores:
                own = (score.token_id, score.logprob, score.rank)
                found["prompt"].append(
                    [own if ranks else own[:2]]
                    + [(a.token_id, a.logprob) for a in score.alternatives]
                )
    return found
