"""A grammar that breaks while its request runs fails that request only, on the real executor:
its neighbours in every step get exactly the tokens and entries they get alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.emission.outputs import ChoiceDelta
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.support.breaking_grammars import row_explosion_grammar
from tests.support.draining import drain
from tests.support.engines import build_engine

NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 3, 1, 2)
BREAKING = GrammarSpec(GrammarKind.GRAMMAR, row_explosion_grammar(), "structured_outputs")
TEXTS = ("the quick brown fox", "every request gets its own slot", "yes no yes")
MAX_TOKENS = 24


def innocents(tokenizer) -> list[EngineRequest]:
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=7)
    logprobs = LogprobAsk(wanted=True, count=3)
    requests = []
    for index, text in enumerate(TEXTS):
        prompt = tuple(tokenizer.encode(text, add_special_tokens=False))
        params = greedy if index % 2 == 0 else seeded
        requests.append(
            EngineRequest(f"innocent{index}", prompt, params, n=1 + index % 2, logprobs=logprobs)
        )
    return requests


def breaking(tokenizer, name: str) -> EngineRequest:
    prompt = tuple(tokenizer.encode("yes or no", add_special_tokens=False))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return EngineRequest(name, prompt, params, grammar=BREAKING)


def outputs(items: list) -> dict[int, tuple[list[int], str, int]]:
    """Per choice: its tokens, its text and how many logprob entries it got. (Entry values
    may move in the last bits with the batch's composition on the CPU, so they are not
    compared; which tokens the lanes chose must not move.)"""
    found: dict[int, tuple[list[int], str, int]] = {}
    for item in items:
        if isinstance(item, ChoiceDelta):
            tokens, text, entries = found.get(item.index, ([], "", 0))
            found[item.index] = (
                tokens + list(item.token_ids),
                text + item.text,
                entries + len(item.logprobs),
            )
    return found


@pytest.mark.model
@pytest.mark.parametrize("speculative", [None, NGRAM], ids=["plain", "ngram"])
def test_a_grammar_that_breaks_mid_output_fails_only_its_own_request(
    tiny_model_dir: Path, speculative
):
    engine, tokenizer, _ = build_engine(tiny_model_dir, speculative=speculative)
    alone = drain(engine, innocents(tokenizer))
    engine, tokenizer, plans = build_engine(tiny_model_dir, speculative=speculative)
    requests = [breaking(tokenizer, "bad0"), *innocents(tokenizer), breaking(tokenizer, "bad1")]

    found = drain(engine, requests, failing={"bad0", "bad1"})

    for name, items in alone.items():
        assert outputs(found[name]) == outputs(items), name
    for name in ("bad0", "bad1"):
        end = found[name][-1]
        assert end.error_param == "structured_outputs"
        assert "grammar" in end.error and "2000" in end.error, end.error
        # Only the first line of llguidance's error: never its dump of the parser's state.
        assert "<state>" not in end.error and "\n" not in end.error
        generated = sum(len(i.token_ids) for i in found[name] if isinstance(i, ChoiceDelta))
        assert 4 <= generated < MAX_TOKENS
    # The grammars broke in steps the innocent lanes shared.
    assert any(len(p.works) > 2 and any(w.grammar for w in p.works) for p in plans)
