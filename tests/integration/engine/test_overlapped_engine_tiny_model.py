"""The overlapped loop on the real executor: a tiny Llama behind a background thread gives every
request exactly what the synchronous loop gives it (tokens, text and logprob values), seeded
sampling, penalties, stops, several choices, preemption and each feature included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from domain.contract.capabilities import LogprobCapability, scored_capacities
from domain.logprobs.rules import LogprobAsk
from domain.overlap.pending import PENDING_TOKEN
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import RecordingObserver
from tests.integration.engine.test_engine_tiny_model import _bytes_per_block
from tests.support.draining import drain, whole_outputs
from tests.support.engines import build_engine

pytestmark = pytest.mark.model

TEXTS = (
    "the quick brown fox",
    "every request gets its own slot",
    "yes no yes no",
    "a b c d e f g",
    "one two three four five six seven eight nine ten",
)
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 3, 1, 2)


def requests(tokenizer, **extra) -> list[EngineRequest]:
    asks = LogprobAsk(wanted=True, count=5, token_ids=(3, 17))
    kinds = [
        {"temperature": 0.0},
        {"temperature": 0.9, "seed": 11},
        {"temperature": 0.8, "top_p": 0.9, "seed": 5, "repetition_penalty": 1.3},
        {"temperature": 0.0, "frequency_penalty": 0.5, "presence_penalty": 0.4, "min_tokens": 6},
        {"temperature": 1.0, "seed": 3, "stop": (" s",)},
    ]
    found = []
    for index, (text, kind) in enumerate(zip(TEXTS, kinds, strict=True)):
        prompt = tuple(tokenizer.encode(text, add_special_tokens=False))
        params = SamplingParams(max_tokens=10 + 4 * index, **kind)
        found.append(
            EngineRequest(f"r{index}", prompt, params, n=1 + index % 2, logprobs=asks, **extra)
        )
    return found


def both(model_dir: Path, make, exact: bool = True, **engine_fields) -> tuple[dict, list]:
    """Each request's outputs under the overlapped loop, equal to the synchronous loop's (with
    `exact` False: tokens, text and ends equal, values within 1e-5), and its executor's plans."""
    outputs, plans = [], None
    for overlapped in (False, True):
        engine, tokenizer, plans = build_engine(model_dir, overlapped=overlapped, **engine_fields)
        items = drain(engine, make(tokenizer))
        outputs.append({rid: whole_outputs(found) for rid, found in items.items()})
    synchronous, overlapped_outputs = outputs
    if exact:
        assert overlapped_outputs == synchronous
    else:
        assert {rid: stripped(found) for rid, found in overlapped_outputs.items()} == {
            rid: stripped(found) for rid, found in synchronous.items()
        }
        pairs = zip(values(overlapped_outputs), values(synchronous), strict=True)
        assert all(abs(a - b) <= 1e-5 for a, b in pairs)
    return overlapped_outputs, plans


def stripped(found: tuple) -> tuple:
    choices, scores, end = found
    return tuple((i, d.token_ids, d.text, d.finish_reason) for i, d in choices), len(scores), end


def values(outputs: dict) -> list[float]:
    return [
        value
        for rid in sorted(outputs)
        for _, delta in outputs[rid][0]
        for entry in delta.logprobs
        for value in (entry.position.chosen.logprob, *entry.position.alternative_logprobs)
    ]


def ahead(plans) -> int:
    return sum(PENDING_TOKEN in work.token_ids for plan in plans for work in plan.works)


def test_sampled_and_seeded_requests_get_exactly_what_the_synchronous_loop_gives(tiny_model_dir):
    found, plans = both(tiny_model_dir, requests)

    assert ahead(plans) > 20
    assert all(len(found[rid][0]) == 1 + int(rid[1:]) % 2 for rid in found)


def test_a_kv_pool_that_preempts_changes_no_token(tiny_model_dir):
    # Preemption falls at other steps than in the synchronous loop, and a re-prefilled cache
    # comes from prefill-shaped products: values move in the last bits, tokens do not.
    observer = RecordingObserver()
    block_bytes = _bytes_per_block(tiny_model_dir, block_size=4)
    _, plans = both(
        tiny_model_dir,
        requests,
        exact=False,
        kv_bytes=block_bytes * 26,
        max_model_len=96,
        observer=observer,
    )

    assert ahead(plans) > 0 and observer.total("preemptions") > 0


def test_grammars_scored_prompts_and_speculation_fall_back_and_match(tiny_model_dir):
    grammar = GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no", "maybe"]))
    both(tiny_model_dir, lambda t: requests(t)[:3] + [constrained(t, grammar)])
    scoring = LogprobCapability(top_k=20, selects_ids=True, scored_capacities=scored_capacities(32))
    both(tiny_model_dir, lambda t: requests(t)[:2] + [scored(t)], capability=scoring)
    _, plans = both(tiny_model_dir, requests, speculative=NGRAM)

    assert ahead(plans) == 0


def constrained(tokenizer, grammar: GrammarSpec) -> EngineRequest:
    prompt = tuple(tokenizer.encode("answer yes or no", add_special_tokens=False))
    return EngineRequest(
        "g", prompt, SamplingParams(temperature=0.0, max_tokens=8), grammar=grammar
    )


def scored(tokenizer) -> EngineRequest:
    prompt = tuple(tokenizer.encode("score every token of this prompt", add_special_tokens=False))
    asks = LogprobAsk(wanted=True, count=2, prompt_logprobs=3)
    return EngineRequest("s", prompt, SamplingParams(temperature=0.0, max_tokens=6), logprobs=asks)
