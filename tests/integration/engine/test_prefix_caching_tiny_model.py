"""Prefix caching on the real executor: a tiny Llama gives requests that read cached KV blocks
the tokens it gives them without the cache, values within rounding, and computes scored
prompts whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.emission.outputs import ChoiceDelta, PromptScores, RequestEnd
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from tests.support.draining import channel_items, step_until_idle
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

SYSTEM = "you are a careful assistant; answer in a few words and say why, then stop. "
QUESTIONS = ("what is red", "name a fruit", "count to five", "what is red")
SCORING = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=scored_capacities(32))


def request(tokenizer, rid: str, text: str, n: int = 1, **asks) -> EngineRequest:
    prompt = tuple(tokenizer.encode(SYSTEM + text, add_special_tokens=False))
    ask = LogprobAsk(wanted=True, count=5, **asks)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    return EngineRequest(rid, prompt, params, n=n, logprobs=ask)


def run(model_dir: Path, caching: bool, waves) -> tuple[dict, list, list]:
    """Each wave's requests submitted once the wave before has finished; per request its
    outputs, the plans and each request's end."""
    engine, tokenizer, plans = build_engine(
        model_dir, capability=SCORING, prefix_caching="sha256" if caching else None
    )
    found, ends = {}, []
    for wave in waves:
        channels = {r.request_id: engine.submit(r) for r in wave(tokenizer)}
        step_until_idle(engine)
        for rid, channel in channels.items():
            items = channel_items(channel)
            assert isinstance(items[-1], RequestEnd) and items[-1].error is None
            ends.append(items[-1])
            found[rid] = items
    return found, plans, ends


def choices(items: list) -> dict:
    merged: dict[int, ChoiceDelta] = {}
    for item in items:
        if isinstance(item, ChoiceDelta):
            merged[item.index] = merged[item.index].merge(item) if item.index in merged else item
    return merged


def values(delta: ChoiceDelta) -> list[float]:
    return [
        value
        for entry in delta.logprobs
        for value in (entry.position.chosen.logprob, *entry.position.alternative_logprobs)
    ]


WAVES = (
    lambda t: [request(t, "first", QUESTIONS[0])],
    lambda t: [request(t, f"q{i}", q, n=1 + i % 2) for i, q in enumerate(QUESTIONS)],
)


def test_hits_give_the_tokens_of_misses_and_values_within_rounding(tiny_model_dir):
    plain, _, _ = run(tiny_model_dir, False, WAVES)
    cached, plans, ends = run(tiny_model_dir, True, WAVES)

    for rid, items in plain.items():
        expected, found = choices(items), choices(cached[rid])
        assert {i: (d.token_ids, d.text, d.finish_reason) for i, d in found.items()} == {
            i: (d.token_ids, d.text, d.finish_reason) for i, d in expected.items()
        }, rid
        for index, delta in found.items():
            pairs = zip(values(delta), values(expected[index]), strict=True)
            assert all(abs(a - b) <= 1e-5 for a, b in pairs), rid
    # The second wave read the system prompt's blocks: its lanes began past position 0, and
    # the repeated question (a whole-prompt hit) still computed its last token.
    first_lanes = {}
    for plan in plans:
        for work in plan.works:
            first_lanes.setdefault((work.slot, work.epoch), work.start_position)
    assert sum(start > 0 for start in first_lanes.values()) >= len(QUESTIONS)
    assert all(end.usage.cached_tokens > 0 for end in ends[1:])
    assert ends[0].usage.cached_tokens == 0


def test_a_scored_prompt_is_computed_whole_after_a_hit_and_scores_exactly_as_without(
    tiny_model_dir,
):
    waves = (
        lambda t: [request(t, "plain", QUESTIONS[0])],
        lambda t: [request(t, "scored", QUESTIONS[0], prompt_logprobs=3)],
    )
    plain, _, _ = run(tiny_model_dir, False, waves)
    cached, _, ends = run(tiny_model_dir, True, waves)

    def scores(items):
        return [s for item in items if isinstance(item, PromptScores) for s in item.scores]

    assert scores(cached["scored"]) == scores(plain["scored"]) != []
    assert choices(cached["scored"]) == choices(plain["scored"])
    assert ends[1].usage.cached_tokens == 0
