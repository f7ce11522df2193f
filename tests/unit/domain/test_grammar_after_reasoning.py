"""A grammar on a reasoning choice starts after the reasoning, over the fake executor: the
thinking is free text, the grammar walks the tokens from the one after the end string (emitted
or forced by the budget), and without the parser's reading it constrains the first token.

The fake choice grammar spells words with token t as letter chr(ord("a") + t % 26); the start
marker (60) and end marker (61, 62) are letters no choice holds, so a grammar that walked the
reasoning would refuse it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from domain.engine.engine import Engine, EngineConfig
from domain.reasoning.thinking import ThinkingBudget, ThinkingMarkers
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from domain.structured.grammar import GrammarKind, GrammarSpec
from tests.fakes import (
    FAKE_EOS,
    FakeExecutor,
    FakeGrammarCompiler,
    FakeTokenizer,
    RecordingObserver,
    next_token,
)
from tests.support.draining import drain
from tests.support.geometry import fake_geometry
from tests.unit.domain.test_thinking_budget import tokens_of

START = (60,)
END = (61, 62)
MARKERS = ThinkingMarkers(START, END)
CHOICES = ("cab", "dog", "bead", "deed")
GRAMMAR = GrammarSpec(GrammarKind.CHOICE, json.dumps(CHOICES))
OPEN_PROMPT = (5, 9, 14, 3, *START)


def thinker(context: Sequence[int], vocab_size: int) -> int:
    """The fake model without markers (1..59) and without EOS."""
    return 1 + (next_token(context, vocab_size) - 1) % 59


def closer(context: Sequence[int], vocab_size: int) -> int:
    """Ends the block the prompt opened itself, three tokens into it."""
    if context[-1] == END[0]:
        return END[1]
    opened = max(i for i, t in enumerate(context) if t == START[0])
    if len(context) - opened - 1 == 3:
        return END[0]
    return thinker(context, vocab_size)


def copying_closer(context: Sequence[int], vocab_size: int) -> int:
    """Repeats the context with period 4 (so n-gram drafts stand), and ends the block the
    prompt opened itself after six tokens."""
    if context[-1] == END[0]:
        return END[1]
    opened = max(i for i, t in enumerate(context) if t == START[0])
    if len(context) - opened - 1 == 6:
        return END[0]
    if context[-4] not in (*START, *END):
        return context[-4]
    return thinker(context, vocab_size)


def make_engine(
    model, *, speculative=None, num_blocks: int = 64, max_model_len: int = 48, observer=None
) -> tuple[Engine, FakeExecutor]:
    geometry = fake_geometry(block_size=2, num_blocks=num_blocks, max_model_len=max_model_len)
    compiler = FakeGrammarCompiler()
    executor = FakeExecutor(geometry, model=model, grammars=compiler)
    config = EngineConfig(max_num_batched_tokens=64, speculative=speculative)
    engine = Engine(executor, FakeTokenizer(), config, grammars=compiler, observer=observer)
    return engine, executor


def reasoning_request(
    rid: str,
    prompt: tuple[int, ...] = OPEN_PROMPT,
    *,
    budget: int | None = None,
    opened: bool | None = True,
    max_tokens: int = 20,
) -> EngineRequest:
    return EngineRequest(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        grammar=GRAMMAR,
        thinking=ThinkingBudget(budget, MARKERS, opened),
    )


def spelled(tokens: Sequence[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in tokens if t != FAKE_EOS)


def answer_after_end(out: list[int]) -> list[int]:
    end = next(i for i in range(len(out)) if tuple(out[i : i + 2]) == END)
    return out[end + 2 :]


def test_the_grammar_starts_after_the_end_the_model_writes_itself():
    engine, executor = make_engine(closer)

    out = tokens_of(drain(engine, [reasoning_request("r")])["r"])

    assert out[3:5] == list(END), out
    assert all(1 <= t < 60 for t in out[:3])
    assert spelled(out[5:]) in CHOICES
    assert out[-1] == FAKE_EOS
    assert not executor.forced_positions
    grammar_lanes = [w for plan in executor.plans for w in plan.works if w.grammar is not None]
    assert grammar_lanes
    assert {w.grammar.start for w in grammar_lanes} == {len(OPEN_PROMPT) + 5}


def test_the_budget_forces_the_end_and_then_the_grammar_takes_over():
    engine, executor = make_engine(thinker)

    out = tokens_of(drain(engine, [reasoning_request("r", budget=4)])["r"])

    assert all(1 <= t < 60 for t in out[:4])
    assert out[4:6] == list(END)
    assert spelled(out[6:]) in CHOICES
    first = len(OPEN_PROMPT) + 4
    assert [position for _, position in executor.forced_positions] == [first, first + 1]
    lanes = [w for plan in executor.plans for w in plan.works if w.sample]
    forced = [w for w in lanes if w.forced_token is not None]
    assert all(w.grammar is None for w in forced)


def test_an_output_the_parser_reads_as_reasoning_counts_from_its_first_token():
    # deepseek_r1's reading: reasoning from the first token though the prompt has no start.
    prompt = (5, 9, 14, 3)
    engine, executor = make_engine(thinker)

    out = tokens_of(drain(engine, [reasoning_request("r", prompt, budget=2)])["r"])

    assert out[2:4] == list(END)
    assert spelled(out[4:]) in CHOICES


def test_without_the_parsers_reading_the_grammar_constrains_the_first_token():
    engine, executor = make_engine(thinker)
    plain = EngineRequest(
        "p", OPEN_PROMPT, SamplingParams(max_tokens=20, temperature=0.0), grammar=GRAMMAR
    )
    requests = [
        reasoning_request("none", budget=2, opened=None),
        reasoning_request("closed", budget=2, opened=False),
        plain,
    ]

    outputs = drain(engine, requests)

    expected = tokens_of(outputs["p"])
    assert spelled(expected) in CHOICES
    # The grammar owns the whole output, so the budget forces nothing.
    assert tokens_of(outputs["none"]) == tokens_of(outputs["closed"]) == expected
    assert not executor.forced_positions


def test_preempted_reasoning_choices_resume_with_their_grammar_from_its_start():
    prompts = [(5 + i, 9, 14, 3, *START) for i in range(5)]
    requests = [
        reasoning_request(f"r{i}", p, budget=2 + i, max_tokens=16) for i, p in enumerate(prompts)
    ]
    reference, _ = make_engine(thinker)
    expected = drain(reference, requests)
    steps = RecordingObserver()
    engine, executor = make_engine(thinker, num_blocks=12, max_model_len=24, observer=steps)

    outputs = drain(engine, requests)

    assert steps.total("preemptions") > 0
    for i in range(5):
        out = tokens_of(outputs[f"r{i}"])
        assert out == tokens_of(expected[f"r{i}"])
        assert spelled(answer_after_end(out)) in CHOICES


def test_no_draft_is_verified_before_the_grammar_starts():
    ngram = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)
    prompt = (5, 9, 14, 3, 5, 9, 14, 3, *START)
    plain, _ = make_engine(copying_closer)
    free, free_executor = make_engine(copying_closer, speculative=ngram)
    engine, executor = make_engine(copying_closer, speculative=ngram)
    request = reasoning_request("r", prompt)
    free_request = EngineRequest("f", prompt, request.params)

    expected = tokens_of(drain(plain, [request])["r"])
    drain(free, [free_request])
    out = tokens_of(drain(engine, [request])["r"])

    assert out == expected
    assert out[6:8] == list(END)
    end_at = len(prompt) + 6
    # The same reasoning without a grammar does verify drafts...
    free_lanes = [w for plan in free_executor.plans for w in plan.works if w.sample]
    assert any(w.drafts for w in free_lanes if w.first_emitted_position < end_at)
    # ...but a choice whose grammar waits for the end verifies none.
    lanes = [w for plan in executor.plans for w in plan.works if w.sample]
    for work in lanes:
        if work.grammar is None:
            assert not work.drafts and work.first_emitted_position < end_at + 2


def test_a_second_engine_over_the_executor_starts_its_grammar_afresh_mid_life():
    # Both engines admit into slot 0 at the same epoch; the second one's grammar first
    # appears after its reasoning, where the first one's finished matcher still sits.
    engine, executor = make_engine(thinker)
    first = tokens_of(drain(engine, [reasoning_request("a", budget=3)])["a"])
    config = EngineConfig(max_num_batched_tokens=64)
    again = Engine(executor, FakeTokenizer(), config, grammars=FakeGrammarCompiler())

    second = tokens_of(drain(again, [reasoning_request("b", budget=3)])["b"])

    assert second == first
    assert spelled(answer_after_end(second)) in CHOICES
