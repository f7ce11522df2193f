"""The engine with history speculation over the fake executor: same outputs, fewer steps.

The fake models here copy: `copier` repeats the context with a period, so n-gram drafts stand;
`stutter` copies but emits a fresh token at every seventh position, so some drafts fall and
the correction takes over. Every test compares against the same run with speculation off and
checks that drafts were offered and accepted, so none can pass vacuously.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from domain.contract.frames import FrameResult
from domain.contract.records import Finish, Role
from domain.emission.outputs import ChoiceDelta
from domain.engine.engine import Engine, EngineConfig
from domain.engine.step import StepPlan
from domain.logprobs.rules import LogprobAsk
from domain.requests.engine_request import EngineRequest
from domain.requests.sampling import SamplingParams
from domain.speculation.drafts import SpeculativeConfig, SpeculativeMethod
from tests.fakes import FAKE_EOS, FakeExecutor, FakeTokenizer, next_token
from tests.support.draining import drain
from tests.support.geometry import fake_geometry

PERIOD = 6
NGRAM = SpeculativeConfig(SpeculativeMethod.NGRAM, 4, 2, 3)


def copier(context: Sequence[int], vocab_size: int) -> int:
    return context[-PERIOD] if len(context) >= PERIOD else next_token(context, vocab_size)


def stutter(context: Sequence[int], vocab_size: int) -> int:
    if len(context) % 7 == 0:
        return next_token(context, vocab_size)
    return copier(context, vocab_size)


class RecordingExecutor(FakeExecutor):
    """The fake, keeping every frame it returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[FrameResult] = []
        self.found: dict[str, list] = {}

    def read(self, frame: int) -> FrameResult:
        result = super().read(frame)
        self.results.append(result)
        return result

    @property
    def speculative_records(self):
        return [r for result in self.results for r in result.records if r.role is Role.SPECULATIVE]


def make_engine(
    model=copier,
    speculative=NGRAM,
    *,
    num_blocks: int = 64,
    budget: int = 32,
    draft_model=None,
) -> tuple[Engine, RecordingExecutor]:
    geometry = fake_geometry(num_blocks=num_blocks, max_model_len=96)
    executor = RecordingExecutor(geometry, model=model, draft_model=draft_model)
    config = EngineConfig(max_num_batched_tokens=budget, speculative=speculative)
    return Engine(executor, FakeTokenizer(), config), executor


def outputs(items: list) -> dict[int, tuple]:
    """Per choice: (token IDs, text, entries as (token, logprob, offset), finish)."""
    found: dict[int, list] = {}
    for item in items:
        if not isinstance(item, ChoiceDelta):
            continue
        tokens, text, entries, finish = found.setdefault(item.index, [[], "", [], None])
        tokens += item.token_ids
        found[item.index][1] = text + item.text
        entries += [(e.position, e.text_offset) for e in item.logprobs]
        if item.finished:
            found[item.index][3] = (item.finish_reason, item.stop_reason)
    return {index: (tuple(v[0]), v[1], tuple(v[2]), v[3]) for index, v in found.items()}


def request(name: str, prompt: tuple[int, ...], logprobs: bool = True, n: int = 1, **params):
    ask = LogprobAsk(wanted=True, count=5) if logprobs else LogprobAsk()
    settings = {"max_tokens": 24, "temperature": 0.0, **params}
    return EngineRequest(name, prompt, SamplingParams(**settings), n, logprobs=ask)


PROMPT = (3, 9, 14, 27, 5, 41, 3, 9, 14, 27)


def compare(requests, model=copier, speculative=NGRAM, **engine_options) -> RecordingExecutor:
    """Runs `requests` with speculation off and on; outputs must be identical."""
    plain_engine, _ = make_engine(model, None, **engine_options)
    plain = drain(plain_engine, requests)
    engine, executor = make_engine(model, speculative, **engine_options)
    speculative = drain(engine, requests)
    for request_id, items in plain.items():
        assert outputs(speculative[request_id]) == outputs(items), request_id
        assert speculative[request_id][-1].usage == items[-1].usage
    executor.found = speculative
    return executor


def accepted(executor: RecordingExecutor) -> int:
    return sum(r.drafts_accepted for r in executor.speculative_records)


def offered(executor: RecordingExecutor) -> int:
    return sum(r.drafts_offered for r in executor.speculative_records)


def test_copied_text_is_accepted_in_runs_and_changes_no_token_entry_or_offset():
    executor = compare([request("copy", PROMPT)])

    assert accepted(executor) >= 10
    assert (
        max(len(r.tokens) for r in executor.speculative_records) == NGRAM.num_speculative_tokens + 1
    )


def test_rejected_drafts_give_way_to_the_correction_and_the_cache_stays_right():
    executor = compare([request("stutter", PROMPT, max_tokens=40)], model=stutter)

    assert 0 < accepted(executor) < offered(executor)
    corrected = [r for r in executor.speculative_records if r.drafts_accepted < r.drafts_offered]
    assert corrected


def test_a_round_without_a_proposal_is_a_width_one_verification():
    executor = compare([request("fresh", (1, 2, 3, 4), max_tokens=10)], model=next_token)

    records = executor.speculative_records
    assert records and all(len(r.tokens) == 1 and r.drafts_offered == 0 for r in records)


def test_a_stop_token_inside_an_accepted_run_ends_the_choice_there():
    stop = PROMPT[2]
    executor = compare([request("stop", PROMPT, stop_token_ids=(stop,))])

    last = executor.speculative_records[-1]
    assert last.tokens[-1] == stop and last.drafts_accepted > 0
    (choice,) = outputs(executor.found["stop"]).values()
    assert choice[3] == ("stop", stop)


def test_max_tokens_reached_inside_an_accepted_run_clips_the_run():
    executor = compare([request(f"len{n}", PROMPT, max_tokens=n) for n in (5, 7, 9)])

    assert accepted(executor) > 0
    for n in (5, 7, 9):
        (choice,) = outputs(executor.found[f"len{n}"]).values()
        assert len(choice[0]) == n and choice[3] == ("length", None)


def test_eos_inside_an_accepted_run_ends_the_choice_with_stop():
    prompt = (3, 9, 14, 27, 5, 41, 3, 9, 14, FAKE_EOS)
    executor = compare([request("eos", prompt, max_tokens=30)])

    ending = executor.speculative_records[-1]
    assert ending.tokens[-1] == FAKE_EOS and len(ending.tokens) > 1
    assert ending.drafts_accepted > 0


def test_a_stop_string_completed_inside_an_accepted_run_cuts_text_and_entries():
    # The copier writes "fpdjob" over and over; "jo" completes inside an accepted run.
    executor = compare([request("cut", PROMPT, stop=("jo",), max_tokens=30)])

    assert accepted(executor) > 0
    last = executor.speculative_records[-1]
    assert last.drafts_accepted > 0 and len(last.tokens) > 1
    (choice,) = outputs(executor.found["cut"]).values()
    assert choice[3] == ("stop", "jo") and choice[1].endswith("fpd")


def test_several_choices_and_requests_share_steps_and_keep_their_outputs():
    executor = compare(
        [
            request("n", PROMPT, n=2, seed=3),
            request("other", (7, 8, 9, 7, 8, 9, 7, 8), logprobs=False),
            request("ids", PROMPT[:8], logprobs=False),
        ]
    )

    assert accepted(executor) > 0


def test_preemption_in_the_middle_of_speculation_loses_and_duplicates_nothing():
    requests = [request(f"r{i}", PROMPT[i:] + PROMPT[:i], max_tokens=30) for i in range(4)]

    executor = compare(requests, num_blocks=26)

    assert accepted(executor) > 0
    starts = [w.start_position for plan in executor.plans for w in plan.works]
    assert starts.count(0) > len(requests), "the pool never forced a re-prefill"


def test_min_tokens_rounds_carry_no_drafts_until_the_minimum_is_out():
    executor = compare([request("min", PROMPT, min_tokens=6, max_tokens=12)])

    for plan in executor.plans:
        for work in plan.works:
            if work.drafts:
                assert not work.sampling.banned_token_ids


def test_k_larger_than_the_record_allows_is_refused_at_start_up():
    too_many = SpeculativeConfig(SpeculativeMethod.NGRAM, 8)

    with pytest.raises(ValueError, match="completion token capacity"):
        make_engine(speculative=too_many)


def test_drafts_never_exceed_k_nor_the_remaining_budget():
    _, executor = make_engine()
    engine, executor = make_engine()
    drain(engine, [request(f"b{n}", PROMPT, max_tokens=n) for n in (3, 6)])

    for plan in executor.plans:
        assert isinstance(plan, StepPlan)
        for work in plan.works:
            assert len(work.drafts) <= NGRAM.num_speculative_tokens
            assert len(work.drafts) <= work.sampling.remaining - 1


def test_the_observer_counts_rounds_drafts_and_acceptances_per_position():
    from tests.fakes import RecordingObserver

    geometry = make_engine()[1].geometry
    executor = RecordingExecutor(geometry, model=stutter)
    observer = RecordingObserver()
    engine = Engine(
        executor,
        FakeTokenizer(),
        EngineConfig(max_num_batched_tokens=32, speculative=NGRAM),
        observer=observer,
    )

    drain(engine, [request("stutter", PROMPT, max_tokens=40)])

    offered_rounds = [r for r in executor.speculative_records if r.drafts_offered]
    assert observer.total("spec_drafts") == len(offered_rounds) > 0
    assert observer.total("spec_draft_tokens") == offered(executor)
    assert observer.total("spec_accepted_tokens") == accepted(executor)
    per_position = [0] * NGRAM.num_speculative_tokens
    for step in observer.steps:
        for position, rounds in enumerate(step.spec_accepted_per_position):
            per_position[position] += rounds
    expected = [sum(r.drafts_accepted > p for r in offered_rounds) for p in range(4)]
    assert per_position == expected and expected[0] > 0


@pytest.mark.parametrize("stop", [PROMPT[5], PROMPT[6]])
def test_drafts_that_a_stop_token_cuts_off_are_not_counted_as_accepted(stop):
    from tests.fakes import RecordingObserver

    geometry = make_engine()[1].geometry
    executor = RecordingExecutor(geometry, model=copier)
    observer = RecordingObserver()
    engine = Engine(
        executor,
        FakeTokenizer(),
        EngineConfig(max_num_batched_tokens=32, speculative=NGRAM),
        observer=observer,
    )

    drain(engine, [request("stop", PROMPT, stop_token_ids=(stop,))])

    # The copier's drafts all stand, so the round ends at the stop token among its drafts.
    last = executor.speculative_records[-1]
    assert last.finish is Finish.STOP_TOKEN and last.tokens[-1] == stop
    assert last.drafts_offered > len(last.tokens)
    assert last.drafts_accepted == len(last.tokens)
    emitted = sum(len(r.tokens) for r in executor.speculative_records if r.drafts_offered)
    assert observer.total("spec_accepted_tokens") == accepted(executor) <= emitted
    positions = [0] * NGRAM.num_speculative_tokens
    for step in observer.steps:
        for position, rounds in enumerate(step.spec_accepted_per_position):
            positions[position] += rounds
    assert sum(positions) == accepted(executor)


DRAFT = SpeculativeConfig(SpeculativeMethod.DRAFT_MODEL, 3, model="fake-draft")


def test_a_draft_model_equal_to_the_target_has_every_draft_accepted():
    executor = compare(
        [request("same", PROMPT, max_tokens=30)], speculative=DRAFT, draft_model=copier
    )

    verified = [r for r in executor.speculative_records if r.drafts_offered]
    assert verified and all(r.drafts_accepted == r.drafts_offered for r in verified)
    assert max(r.drafts_offered for r in verified) == DRAFT.num_speculative_tokens


def test_a_differing_draft_model_keeps_its_cache_in_step_with_acceptance():
    # The fake draft cache raises if a round starts where its contents disagree with the
    # target's tokens, so every rejection must have rolled it back.
    executor = compare(
        [request("stutter", PROMPT, max_tokens=40)],
        model=stutter,
        speculative=DRAFT,
        draft_model=copier,
    )

    assert 0 < accepted(executor) < offered(executor)


def test_preemption_rebuilds_the_draft_cache_from_the_start():
    requests = [request(f"r{i}", PROMPT[i:] + PROMPT[:i], max_tokens=30) for i in range(4)]

    executor = compare(
        requests, model=stutter, speculative=DRAFT, draft_model=copier, num_blocks=26
    )

    assert accepted(executor) > 0
    proposing = [w.speculation for plan in executor.plans for w in plan.works if w.speculation]
    restarts = [lane for lane in proposing if lane.propose and not lane.draft_start]
    assert len(restarts) > len(requests), "no draft cache was rebuilt after a preemption"
