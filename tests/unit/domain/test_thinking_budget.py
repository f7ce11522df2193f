"""The thinking budget over the fake executor: reasoning closes at the budget with forced end
tokens that have no entries, count in usage, survive preemption and never ride on drafts.

The fake `thinker` never emits a marker itself, so every end token in its output was forced;
`closer` ends its reasoning by itself after three tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from domain.common.errors import InvalidRequestError
from domain.contract.records import Role
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.logprobs.rules import LogprobAsk
from domain.reasoning.thinking import ThinkingBudget, ThinkingMarkers
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from tests.fakes import FakeExecutor, FakeTokenizer, RecordingObserver, fake_position, next_token
from tests.support.draining import drain
from tests.support.geometry import fake_geometry

START = (60,)
END = (61, 62)
MARKERS = ThinkingMarkers(START, END)
GEOMETRY = fake_geometry(max_model_len=96)


def thinker(context: Sequence[int], vocab_size: int) -> int:
    """The fake model with markers taken out: 1..59 only."""
    return 1 + (next_token(context, vocab_size) - 1) % 59


def closer(context: Sequence[int], vocab_size: int) -> int:
    """Closes a reasoning block by itself three tokens after it opened."""
    if context[-1] == END[0]:
        return END[1]
    opened = max((i for i, t in enumerate(context) if t == START[0]), default=None)
    if opened is not None and len(context) - opened - 1 == 3 and END[1] not in context[opened:]:
        return END[0]
    return thinker(context, vocab_size)


def make_engine(
    model=thinker, *, speculative=None, draft_model=None, budget: int = 32, observer=None, **sizes
):
    geometry = fake_geometry(**{"max_model_len": 96, **sizes})
    executor = FakeExecutor(geometry, model=model, draft_model=draft_model)
    config = EngineConfig(max_num_batched_tokens=budget, speculative=speculative)
    return Engine(executor, FakeTokenizer(), config, observer=observer), executor


def budget_request(
    rid: str,
    prompt: tuple[int, ...],
    budget: int | None,
    max_tokens: int = 14,
    *,
    logprobs: bool = False,
    n: int = 1,
) -> EngineRequest:
    return EngineRequest(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        n,
        logprobs=LogprobAsk(wanted=True, count=2) if logprobs else LogprobAsk(),
        thinking=None if budget is None else ThinkingBudget(budget, MARKERS),
    )


def tokens_of(items: list, index: int = 0) -> list[int]:
    return [
        t for i in items if isinstance(i, ChoiceDelta) and i.index == index for t in i.token_ids
    ]


def entries_of(items: list, index: int = 0) -> list:
    return [e for i in items if isinstance(i, ChoiceDelta) and i.index == index for e in i.logprobs]


def greedy(model, context: list[int], count: int) -> list[int]:
    out = []
    for _ in range(count):
        out.append(model(context, 64))
        context.append(out[-1])
    return out


def expected_after_open(prompt: tuple[int, ...], budget: int, total: int) -> list[int]:
    """An opened block: `budget` model tokens, the end tokens, then model tokens to `total`."""
    context = list(prompt)
    thought = greedy(thinker, context, budget)
    context.extend(END)
    answer = greedy(thinker, context, total - budget - len(END))
    return thought + list(END) + answer


PROMPT = (5, 9, 14, 3, *START)


def test_reasoning_opened_by_the_prompt_closes_exactly_at_the_budget():
    engine, executor = make_engine()

    out = tokens_of(drain(engine, [budget_request("r", PROMPT, 4)])["r"])

    assert out == expected_after_open(PROMPT, 4, 14)
    # The end tokens were forced at the positions right after the fourth reasoning token.
    first = len(PROMPT) + 4
    assert [position for _, position in executor.forced_positions] == [first, first + 1]


def test_a_zero_budget_closes_the_block_at_once():
    engine, _ = make_engine()

    out = tokens_of(drain(engine, [budget_request("r", PROMPT, 0)])["r"])

    assert out[:2] == list(END)
    assert out == expected_after_open(PROMPT, 0, 14)


def test_forced_tokens_have_no_entries_and_the_sampled_ones_keep_theirs():
    engine, _ = make_engine()

    items = drain(engine, [budget_request("r", PROMPT, 3, logprobs=True)])["r"]

    out = tokens_of(items)
    entries = entries_of(items)
    forced_at = {3, 4}
    kept = [t for i, t in enumerate(out) if i not in forced_at]
    assert [e.position.chosen.token_id for e in entries] == kept
    # Each sampled token's entry is the model's value after everything before it, forced
    # tokens included.
    sampled_at = [i for i in range(len(out)) if i not in forced_at]
    for index, entry in zip(sampled_at, entries, strict=True):
        context = [*PROMPT, *out[:index]]
        options = entry_options()
        expected = fake_position(context, out[index], options, options.top_k, 64, thinker)
        assert entry.position == expected


def entry_options():
    return LogprobAsk(wanted=True, count=2).options


def test_usage_counts_forced_tokens_as_completion_tokens():
    engine, _ = make_engine()

    items = drain(engine, [budget_request("r", PROMPT, 2, max_tokens=9)])["r"]

    assert len(tokens_of(items)) == 9
    assert items[-1].usage.completion_tokens == 9
    assert items[-1].usage.prompt_tokens == len(PROMPT)


def test_max_tokens_can_end_a_choice_in_the_middle_of_a_forced_end():
    engine, _ = make_engine()

    items = drain(engine, [budget_request("r", PROMPT, 2, max_tokens=3)])["r"]

    assert tokens_of(items) == expected_after_open(PROMPT, 2, 14)[:3]
    assert tokens_of(items)[-1] == END[0]
    assert items[-2].finish_reason == "length"


def test_a_model_that_closes_its_reasoning_in_time_is_not_forced():
    engine, executor = make_engine(closer)

    out = tokens_of(drain(engine, [budget_request("r", PROMPT, 5)])["r"])

    assert out == greedy(closer, list(PROMPT), 14)
    assert out[3:5] == list(END)
    assert executor.forced_positions == []


def test_a_start_in_the_output_opens_a_block_with_its_own_count():
    def opener(context: Sequence[int], vocab_size: int) -> int:
        # Opens a block as its third output token (the prompt has four tokens).
        return START[0] if len(context) == 6 else thinker(context, vocab_size)

    engine, _ = make_engine(opener)
    prompt = (5, 9, 14, 3)

    out = tokens_of(drain(engine, [budget_request("r", prompt, 2, max_tokens=10)])["r"])

    assert out[2] == START[0]
    assert out[5:7] == list(END)
    assert START[0] not in out[3:5] and END[0] not in out[3:5]


def test_without_a_budget_nothing_is_forced():
    engine, executor = make_engine()

    out = tokens_of(drain(engine, [budget_request("r", PROMPT, None)])["r"])

    assert out == greedy(thinker, list(PROMPT), 14)
    assert executor.forced_positions == []


def test_every_choice_of_n_closes_at_the_budget():
    engine, _ = make_engine()

    items = drain(engine, [budget_request("r", PROMPT, 3, n=3)])["r"]

    for index in range(3):
        assert tokens_of(items, index) == expected_after_open(PROMPT, 3, 14)
    assert items[-1].usage.completion_tokens == 3 * 14


def test_preemption_and_readmission_keep_the_budget_state():
    prompts = [(5 + i, 9, 14, 3, *START) for i in range(5)]
    requests = [budget_request(f"r{i}", p, 3 + i, max_tokens=12) for i, p in enumerate(prompts)]
    steps = RecordingObserver()
    engine, executor = make_engine(
        num_blocks=12, block_size=2, max_model_len=24, budget=64, observer=steps
    )

    outputs = drain(engine, requests)

    assert steps.total("preemptions") > 0
    for i, prompt in enumerate(prompts):
        assert tokens_of(outputs[f"r{i}"]) == expected_after_open(prompt, 3 + i, 12)
    # A readmitted choice re-prefills its outputs, forced ones included, and forces no more.
    assert len(executor.forced_positions) == 2 * len(prompts)


def copier(context: Sequence[int], vocab_size: int) -> int:
    """Repeats the context with period 4 (so n-gram drafts stand), markers never."""
    if len(context) >= 4 and context[-4] not in (*START, *END):
        return context[-4]
    return thinker(context, vocab_size)


def test_speculation_drafts_up_to_the_budget_but_never_past_it():
    ngram = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)
    prompt = (5, 9, 14, 3, 5, 9, 14, 3, *START)
    plain_engine, _ = make_engine(copier)
    engine, executor = make_engine(copier, speculative=ngram)
    request = budget_request("r", prompt, 9, max_tokens=20)

    expected = tokens_of(drain(plain_engine, [request])["r"])
    out = tokens_of(drain(engine, [request])["r"])

    assert out == expected
    assert out[9:11] == list(END)
    lanes = [w for plan in executor.plans for w in plan.works if w.sample]
    assert any(w.drafts for w in lanes), "drafts were offered"
    forced = [w for w in lanes if w.forced_token is not None]
    assert [w.forced_token for w in forced] == list(END)
    assert not any(w.speculation is not None for w in forced)
    # No round emitted a reasoning token past the budget: every round before the forced end
    # ends at or before position len(prompt) + 9.
    for w in lanes:
        if w.first_emitted_position < len(prompt) + 9:
            assert w.first_emitted_position + len(w.drafts) < len(prompt) + 9


def test_speculative_records_are_used_and_forced_records_are_marked():
    ngram = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)
    engine, executor = make_engine(copier, speculative=ngram)
    original = executor.read
    records = []

    def read(frame):
        result = original(frame)
        records.extend(result.records)
        return result

    executor.read = read  # type: ignore[method-assign]
    drain(engine, [budget_request("r", (5, 9, 14, 3, 5, 9, 14, 3, *START), 6, max_tokens=16)])

    forced = [r for r in records if r.forced_mask]
    assert [r.tokens for r in forced] == [(END[0],), (END[1],)]
    assert all(r.role is Role.SAMPLE and r.is_forced(0) for r in forced)
    assert any(r.role is Role.SPECULATIVE and r.drafts_accepted for r in records)


def half_closer(context: Sequence[int], vocab_size: int) -> int:
    """Begins the end string (its first token only) two tokens after a block opened."""
    opened = max((i for i, t in enumerate(context) if t == START[0]), default=None)
    if opened is not None and len(context) - opened - 1 == 2:
        return END[0]
    return thinker(context, vocab_size)


def test_a_budget_reached_inside_a_begun_end_forces_only_the_rest_of_it():
    tracker = ThinkingBudget(3, MARKERS).tracker(PROMPT)

    tracker.observe((7, 8, END[0]))

    # The model's own first end token counted as the third; forcing goes on from it.
    assert tracker.forced_next == END[1]
    tracker.observe((END[1],))
    assert tracker.forced_next is None
    assert not tracker.in_reasoning


def test_the_end_string_appears_once_when_the_model_began_it_at_the_budget():
    engine, executor = make_engine(half_closer)

    out = tokens_of(drain(engine, [budget_request("r", PROMPT, 3, max_tokens=8)])["r"])

    thought = greedy(half_closer, list(PROMPT), 3)
    assert thought[2] == END[0]
    assert out[:4] == [*thought, END[1]]
    # Only the second end token was forced, right after the model's first.
    assert [position for _, position in executor.forced_positions] == [len(PROMPT) + 3]


def test_a_budget_outside_its_range_names_the_field():
    for budget in (-1, 2**31):
        with pytest.raises(InvalidRequestError) as raised:
            ThinkingBudget(budget, MARKERS)
        assert raised.value.param == "thinking_token_budget"


def test_the_tracker_counts_after_a_multi_token_start_in_the_prompt():
    markers = ThinkingMarkers((7, 8), (9,))
    tracker = ThinkingBudget(3, markers).tracker((1, 7, 8, 4, 5))

    assert tracker.in_reasoning and tracker.room == 1 and tracker.forced_next is None
    tracker.observe((6,))
    assert tracker.forced_next == 9 and tracker.room == 0
    tracker.observe((9,))
    assert not tracker.in_reasoning and tracker.forced_next is None
    # Outside a block the next token could complete a start, so one round holds budget + 1.
    assert tracker.room == 4


def test_the_tracker_ignores_a_block_the_prompt_already_closed():
    tracker = ThinkingBudget(0, ThinkingMarkers((7,), (9,))).tracker((7, 1, 9, 2))

    assert not tracker.in_reasoning and tracker.forced_next is None
    tracker.observe((7,))
    assert tracker.forced_next == 9


def test_a_draft_model_never_proposes_past_the_budget():
    speculative = SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 4, model="draft")
    plain_engine, _ = make_engine(copier)
    # The draft agrees with the target, so its proposals stand until the budget cuts them.
    engine, executor = make_engine(copier, speculative=speculative, draft_model=copier)
    prompt = (5, 9, 14, 3, 5, 9, 14, 3, *START)
    request = budget_request("r", prompt, 7, max_tokens=20)

    expected = tokens_of(drain(plain_engine, [request])["r"])
    out = tokens_of(drain(engine, [request])["r"])

    assert out == expected and out[7:9] == list(END)
    lanes = [w for plan in executor.plans for w in plan.works if w.sample]
    proposed = [(w, w.speculation.propose if w.speculation else 0) for w in lanes]
    assert any(count for _, count in proposed), "the draft model proposed"
    for w, count in proposed:
        if w.first_emitted_position < len(prompt) + 7:
            assert w.first_emitted_position + count < len(prompt) + 7
        if w.forced_token is not None:
            assert w.speculation is None
