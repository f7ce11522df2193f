"""The ModelExecutor port's invariants, held by the fake and by the torch executor alike.

Each test states one invariant of `ports.executor.ModelExecutor`; the suite runs against
`tests.fakes.FakeExecutor` and the torch executor over a tiny model, so the fake the unit tests
rely on cannot drift from the real thing.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from domain.contract.capabilities import FULL_LOGPROBS, NO_LOGPROBS
from domain.contract.records import Finish, Role
from domain.engine.commit import commit_round
from domain.engine.step import SlotWork, StepPlan
from domain.logprobs.prompt_scores import prompt_targets
from domain.logprobs.values import NO_TOKEN, LogprobOptions, sort_key
from domain.overlap.pending import PENDING_TOKEN
from domain.requests.choice_sampling import LaneSampling
from domain.requests.sampling import SamplingParams
from domain.speculation.choice import DraftLane
from domain.structured.constraint import GrammarLane
from domain.structured.grammar import GrammarKind, GrammarSpec
from ports.executor import ModelExecutor
from tests.fakes import FakeExecutor, FakeGrammarCompiler
from tests.support.geometry import fake_geometry

BLOCK = 4
SCORED_CAPACITY = 32
# Both executors serve the full logprob core and score prompts of up to 32 rows.
SCORING = replace(FULL_LOGPROBS, scored_capacities=(SCORED_CAPACITY,))
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, top_k=20)
# The fake's sizes; the torch executor's come from `torch_settings` and the tiny model.
FAKE_GEOMETRY = fake_geometry(logprobs=NO_LOGPROBS, block_size=BLOCK, max_model_len=128)


def torch_settings():
    from adapters.gpu.factory import RunnerSettings

    return RunnerSettings(
        device="cpu", max_num_seqs=8, max_model_len=128, kv_cache_bytes=4 << 20, block_size=BLOCK
    )


@pytest.fixture(scope="module", params=["fake", pytest.param("torch", marks=pytest.mark.model)])
def executor(request, tmp_path_factory) -> ModelExecutor:
    if request.param == "fake":
        return FakeExecutor(replace(FAKE_GEOMETRY, logprobs=SCORING))
    return _torch_executor(tmp_path_factory)


def _torch_executor(tmp_path_factory):
    from adapters.gpu.factory import build_executor
    from adapters.tokenizer.hf import HfTokenizer
    from tests.support.tiny_serving import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("conformance"))
    settings = torch_settings()
    vocab_size = HfTokenizer.from_dir(model_dir).vocab_size
    return build_executor(model_dir, settings, vocab_size, capability=SCORING)


class Lanes:
    """Builds lanes on distinct slots and KV blocks, as the scheduler would."""

    def __init__(self) -> None:
        self._next_block = 0

    def work(
        self,
        slot: int,
        prompt: tuple[int, ...],
        *,
        params: SamplingParams = GREEDY,
        sample: bool = True,
        remaining: int = 8,
        stop_token_ids: frozenset[int] = frozenset(),
        logprobs: LogprobOptions | None = None,
        scored: bool = False,
        seed: int = 5,
        drafts: tuple[int, ...] = (),
    ) -> SlotWork:
        blocks = -(-(len(prompt) + len(drafts) + remaining) // BLOCK)
        table = tuple(range(self._next_block, self._next_block + blocks))
        self._next_block += blocks
        return SlotWork(
            slot=slot,
            epoch=1,
            token_ids=prompt + drafts,
            start_position=0,
            block_table=table,
            prompt_len=len(prompt),
            sample=sample,
            sampling=LaneSampling(
                params, seed, stop_token_ids, (), remaining, logprobs if sample else None
            ),
            prompt_targets=tuple(prompt_targets(prompt, 0, len(prompt))) if scored else (),
            speculation=DraftLane(drafts=drafts) if drafts else None,
        )


def prompt(seed: int, length: int = 6, vocab: int = 60) -> tuple[int, ...]:
    return tuple(3 + (seed * 17 + index * 29) % (vocab - 3) for index in range(length))


def run(executor: ModelExecutor, *works: SlotWork, scored: bool = False):
    return executor.read(executor.submit(StepPlan(tuple(works), scored=scored)))


def test_frames_alternate_and_hold_one_record_per_lane_in_plan_order(executor):
    lanes = Lanes()
    plan = StepPlan((lanes.work(3, prompt(1)), lanes.work(1, prompt(2), sample=False)))

    first = executor.submit(plan)
    result = executor.read(first)
    second = executor.submit(StepPlan((Lanes().work(2, prompt(3)),)))
    executor.read(second)

    assert {first, second} == {0, 1}
    assert [record.slot for record in result.records] == [3, 1]
    assert result.frame == first


def test_a_sampling_lane_emits_what_the_shared_commit_rule_keeps(executor):
    lanes = Lanes()
    probe = run(executor, lanes.work(0, prompt(4))).records[0]
    token_id = probe.tokens[0]
    works = (
        Lanes().work(0, prompt(4), stop_token_ids=frozenset({token_id})),
        Lanes().work(0, prompt(4), remaining=1),
        Lanes().work(0, prompt(4), remaining=5),
    )

    records = [run(executor, work).records[0] for work in works]

    for work, record in zip(works, records, strict=True):
        assert record.role is Role.SAMPLE
        assert (record.tokens, record.finish) == commit_round(work, (token_id,))[:2]
        assert record.first_position == work.end_position
    assert [record.finish for record in records] == [Finish.STOP_TOKEN, Finish.LENGTH, Finish.NONE]


def test_a_lane_that_only_feeds_its_prompt_emits_nothing(executor):
    record = run(executor, Lanes().work(5, prompt(5), sample=False)).records[0]

    assert record.role is Role.PROMPT and record.tokens == () and not record.emits


def test_only_requesting_lanes_carry_payloads_and_none_without_a_request(executor):
    lanes = Lanes()
    plain = run(executor, lanes.work(0, prompt(6)))
    mixed = run(
        executor,
        lanes.work(1, prompt(7), logprobs=LogprobOptions(top_k=3)),
        lanes.work(2, prompt(8)),
    )

    assert plain.logprobs == ()
    assert mixed.lane_logprobs(1) is None
    (position,) = mixed.lane_logprobs(0)
    assert position.chosen.token_id == mixed.records[0].tokens[0]


def test_natural_alternatives_follow_the_reported_order(executor):
    result = run(executor, Lanes().work(0, prompt(9), logprobs=LogprobOptions(top_k=5)))

    (position,) = result.lane_logprobs(0)

    keys = [sort_key(a.logprob, a.token_id) for a in position.alternatives]
    assert len(position.alternatives) == 5 and keys == sorted(keys, reverse=True)
    assert all(a.logprob <= 0.0 for a in position.alternatives)
    # The chosen token of a greedy lane is the best alternative, with the same value.
    assert position.alternatives[0] == position.chosen


def test_a_lane_reads_the_natural_alternatives_it_asked_for_and_no_more(executor):
    lanes = Lanes()
    result = run(
        executor,
        lanes.work(0, prompt(9), logprobs=LogprobOptions(top_k=0)),
        lanes.work(1, prompt(12), logprobs=LogprobOptions(top_k=3)),
    )

    (nothing,) = result.lane_logprobs(0)
    (three,) = result.lane_logprobs(1)

    assert nothing.alternatives == () and nothing.chosen.token_id == result.records[0].tokens[0]
    assert len(three.alternatives) == 3


def test_selected_ids_come_in_caller_order_with_the_same_normalization(executor):
    selected = (9, 4, 31)
    natural = run(executor, Lanes().work(0, prompt(10), logprobs=LogprobOptions(top_k=20)))
    chosen = run(executor, Lanes().work(0, prompt(10), logprobs=LogprobOptions(token_ids=selected)))

    (reference,) = natural.lane_logprobs(0)
    (position,) = chosen.lane_logprobs(0)

    assert [a.token_id for a in position.alternatives] == list(selected)
    assert position.chosen == reference.chosen
    by_id = {a.token_id: a.logprob for a in reference.alternatives}
    for alternative in position.alternatives:
        if alternative.token_id in by_id:
            assert alternative.logprob == by_id[alternative.token_id]


def test_a_seeded_lane_samples_the_same_token_whatever_the_batch(executor):
    alone = run(executor, Lanes().work(4, prompt(11), params=SAMPLED, seed=77)).records[0]
    lanes = Lanes()
    crowd = run(
        executor,
        lanes.work(0, prompt(12), params=SAMPLED, seed=1),
        lanes.work(4, prompt(11), params=SAMPLED, seed=77),
        lanes.work(6, prompt(13), params=SAMPLED, seed=2),
    ).records[1]

    assert crowd.tokens == alone.tokens


def _next(work: SlotWork, token: int) -> SlotWork:
    """The lane's decode step after its prompt: feeding `token` (or the placeholder)."""
    sampling = replace(work.sampling, remaining=work.sampling.remaining - 1)
    fed = len(work.token_ids)
    return replace(work, token_ids=(token,), start_position=fed, sampling=sampling)


def test_a_plan_made_ahead_reads_what_the_same_plans_read_in_turn(executor):
    """The overlapped loop submits step N + 1, whose lanes feed placeholders, before it reads
    step N; an executor may commit N only after it launched N + 1 (`commits_late`)."""
    asks = LogprobOptions(top_k=3)
    lanes = Lanes()
    greedy, seeded = (
        lanes.work(1, prompt(15), logprobs=asks),
        lanes.work(3, prompt(16), params=SAMPLED, seed=9),
    )
    first = run(executor, greedy, seeded)
    tokens = [record.tokens[-1] for record in first.records]
    second = run(executor, _next(greedy, tokens[0]), _next(seeded, tokens[1]))

    lanes = Lanes()
    greedy, seeded = (
        lanes.work(1, prompt(15), logprobs=asks),
        lanes.work(3, prompt(16), params=SAMPLED, seed=9),
    )
    ahead = executor.submit(StepPlan((greedy, seeded)))
    after = executor.submit(StepPlan((_next(greedy, PENDING_TOKEN), _next(seeded, PENDING_TOKEN))))
    read_ahead, read_after = executor.read(ahead), executor.read(after)

    assert read_ahead.records == first.records and read_after.records == second.records
    assert read_ahead.logprobs == first.logprobs and read_after.logprobs == second.logprobs
    assert [r.tokens for r in read_after.records] != [(PENDING_TOKEN,)] * 2


@pytest.mark.model
def test_a_late_commit_that_fails_fails_its_own_read_and_the_next_step_runs_on(
    tmp_path_factory, monkeypatch
):
    """The torch executor commits a plain step after it launched the next one: a failure of
    that commit belongs to the step it commits, never to the one it ran beside."""
    executor = _torch_executor(tmp_path_factory)
    work = Lanes().work(2, prompt(17), logprobs=LogprobOptions(top_k=2))
    first = run(executor, work)
    second = run(executor, _next(work, first.records[0].tokens[-1]))
    commit, failed = executor._commit, []

    def failing_once(frame, plan, sampled, retired):
        if not failed:
            failed.append(frame)
            raise RuntimeError("the commit of this step broke")
        return commit(frame, plan, sampled, retired)

    monkeypatch.setattr(executor, "_commit", failing_once)
    ahead = executor.submit(StepPlan((work,)))
    after = executor.submit(StepPlan((_next(work, PENDING_TOKEN),)))

    with pytest.raises(RuntimeError, match="the commit of this step broke"):
        executor.read(ahead)
    result = executor.read(after)
    assert failed == [ahead]
    assert result.records == second.records and result.logprobs == second.logprobs


def test_a_scored_plan_scores_every_row_against_its_target(executor):
    tokens = prompt(14, length=10)
    lane = Lanes().work(2, tokens, scored=True, logprobs=LogprobOptions(top_k=1))

    result = run(executor, lane, scored=True)

    (rows,) = result.prompt_scores
    assert len(rows) == len(tokens)
    for target, score in zip(lane.prompt_targets, rows, strict=True):
        if target == NO_TOKEN:
            assert score is None
            continue
        assert score.token_id == target and score.rank >= 1 and score.logprob <= 0.0
        assert len(score.alternatives) == 20
        better = [a for a in score.alternatives if a.logprob > score.logprob]
        assert score.rank == len(better) + 1 or len(better) == 20
    assert result.records[0].tokens and result.lane_logprobs(0) is not None


def test_a_speculative_lane_keeps_drafts_that_match_and_emits_one_more(executor):
    tokens = prompt(15)
    greedy = [run(executor, Lanes().work(0, tokens, remaining=8)).records[0].tokens[0]]
    greedy.append(run(executor, Lanes().work(0, tokens + tuple(greedy))).records[0].tokens[0])
    wrong = (greedy[0], (greedy[1] + 1) % 50 + 3)
    asked = LogprobOptions(top_k=2)

    kept = run(executor, Lanes().work(1, tokens, drafts=tuple(greedy), logprobs=asked))
    fixed = run(executor, Lanes().work(1, tokens, drafts=wrong, logprobs=asked))

    full, corrected = kept.records[0], fixed.records[0]
    assert full.role is Role.SPECULATIVE and (full.drafts_offered, full.drafts_accepted) == (2, 2)
    assert full.tokens[:2] == tuple(greedy) and len(full.tokens) == 3
    assert (corrected.drafts_offered, corrected.drafts_accepted) == (2, 1)
    assert corrected.tokens == tuple(greedy)  # the correction is the target's own token
    assert full.first_position == corrected.first_position == len(tokens)
    for result, record in ((kept, full), (fixed, corrected)):
        payload = result.lane_logprobs(0)
        assert [p.chosen.token_id for p in payload] == list(record.tokens)


def test_a_stop_token_among_accepted_drafts_counts_only_the_drafts_it_emits(executor):
    tokens = prompt(15)
    greedy = [run(executor, Lanes().work(0, tokens, remaining=8)).records[0].tokens[0]]
    greedy.append(run(executor, Lanes().work(0, tokens + tuple(greedy))).records[0].tokens[0])
    stop = frozenset({greedy[0]})

    result = run(executor, Lanes().work(1, tokens, drafts=tuple(greedy), stop_token_ids=stop))

    # Both drafts stand, but the first is a stop token: the second is never emitted.
    record = result.records[0]
    assert (record.tokens, record.finish) == ((greedy[0],), Finish.STOP_TOKEN)
    assert (record.drafts_offered, record.drafts_accepted) == (2, 1)


@pytest.fixture(scope="module", params=["fake", pytest.param("torch", marks=pytest.mark.model)])
def breaking(request, tmp_path_factory) -> tuple[ModelExecutor, GrammarSpec]:
    """An executor with a grammar engine, and a constraint that compiles but breaks at the
    first token its lane emits."""
    if request.param == "fake":
        spec = GrammarSpec(GrammarKind.CHOICE, json.dumps(["abc"]), "response_format")
        return FakeExecutor(FAKE_GEOMETRY, grammars=FakeGrammarCompiler(row_limit=0)), spec
    from adapters.gpu.factory import build_executor
    from adapters.grammar.llguidance_compiler import LlguidanceCompiler
    from adapters.tokenizer.hf import HfTokenizer
    from tests.support.tiny_serving import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path_factory.mktemp("conformance-grammar"))
    settings = torch_settings()
    tokenizer = HfTokenizer.from_dir(model_dir)
    executor = build_executor(
        model_dir, settings, tokenizer.vocab_size, grammars=LlguidanceCompiler(tokenizer)
    )
    # Three thousand alternatives in one rule: llguidance's row of 3001 items outgrows its
    # limit of 2000 when the first token is taken.
    alternatives = " | ".join(f'"w{index}"' for index in range(3000))
    return executor, GrammarSpec(
        GrammarKind.GRAMMAR, f"start: {alternatives}", "structured_outputs"
    )


def test_a_lane_whose_grammar_breaks_is_retired_and_its_neighbours_commit(breaking):
    executor, spec = breaking
    alone = run(executor, Lanes().work(3, prompt(21))).records[0]
    lanes = Lanes()

    result = run(
        executor,
        replace(lanes.work(0, prompt(20)), grammar=GrammarLane(spec, len(prompt(20)))),
        lanes.work(3, prompt(21)),
    )

    retired, neighbour = result.records
    assert retired.role is Role.INVALID and retired.finish is Finish.ERROR
    assert not retired.emits
    (failure,) = result.failures
    assert (failure.slot, failure.epoch, failure.param) == (0, 1, spec.param)
    assert neighbour.role is Role.SAMPLE and neighbour.tokens == alone.tokens
