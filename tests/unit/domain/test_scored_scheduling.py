"""Scheduling of scored prompts: scored-only steps, alternation, readmission, zero budgets."""

from __future__ import annotations

import dataclasses

from domain.contract.records import CompletionRecord, Role
from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.logprobs.scoring import PromptScoring
from tests.unit.domain.test_scheduler import make_sequence


def make_scheduler(**overrides: int) -> Scheduler:
    limits = dict(
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_blocks=32,
        max_model_len=64,
        scored_token_limit=16,
    )
    limits.update(overrides)
    return Scheduler(SchedulerConfig(**limits))


def scored_sequence(request_id: str, prompt_len: int, max_tokens: int = 100):
    sequence = make_sequence(request_id, prompt_len, max_tokens)
    return dataclasses.replace(sequence, scoring=PromptScoring(sequence.prompt))


def commit(scheduler: Scheduler, plan, publish: bool = True) -> None:
    """Commits every lane; scored lanes publish their rows, as the engine does."""
    records = tuple(
        CompletionRecord(
            w.slot,
            w.epoch,
            Role.SAMPLE if w.sample else Role.SCORED if plan.scored else Role.PROMPT,
            (9,) if w.sample else (),
            first_position=w.end_position,
        )
        for w in plan.works
    )
    for sequence, record, lane in scheduler.commit(records):
        scheduler.extend(sequence, record.tokens)
        work = plan.works[lane]
        if publish and work.prompt_targets:
            published = [t for t in work.prompt_targets if t >= 0]
            sequence.scoring.scored_rows += len(published)


def test_scored_and_ordinary_work_alternate_and_never_share_a_step():
    scheduler = make_scheduler()
    scheduler.add(make_sequence("plain", 40))
    scheduler.add(scored_sequence("scored", 40))
    kinds = []
    for _ in range(6):
        plan = scheduler.schedule()
        assert all(bool(w.prompt_targets) == plan.scored for w in plan.works)
        kinds.append(plan.scored)
        commit(scheduler, plan)
    assert kinds[:4] == [False, True, False, True]


def test_chunk_targets_are_the_next_prompt_tokens_and_minus_one_at_the_end():
    scheduler = make_scheduler(max_num_batched_tokens=8, scored_token_limit=8)
    sequence = scored_sequence("s", 10)
    scheduler.add(sequence)
    first = scheduler.schedule()
    commit(scheduler, first)
    second = scheduler.schedule()

    assert first.scored and first.works[0].prompt_targets == tuple(range(2, 10))
    assert second.works[0].prompt_targets == (10, -1)
    assert second.works[0].sample


def test_the_scored_chunk_limit_caps_scored_steps_below_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=16, scored_token_limit=6)
    scheduler.add(scored_sequence("s", 20))
    assert scheduler.schedule().num_tokens == 6


def test_readmission_after_preemption_masks_rows_already_published():
    scheduler = make_scheduler(max_num_batched_tokens=8, scored_token_limit=8)
    sequence = scored_sequence("s", 20)
    scheduler.add(sequence)
    commit(scheduler, scheduler.schedule())
    commit(scheduler, scheduler.schedule())
    assert sequence.scoring.scored_rows == 16
    scheduler._preempt(sequence)  # noqa: SLF001 - what running out of KV blocks does

    again = scheduler.schedule()
    assert again.scored and again.works[0].start_position == 0
    assert again.works[0].prompt_targets == (-1,) * 8
    commit(scheduler, again)
    commit(scheduler, scheduler.schedule())
    last = scheduler.schedule()
    assert last.works[0].prompt_targets == (18, 19, 20, -1)
    assert sequence.num_preemptions == 1


def test_a_zero_output_budget_prefills_without_sampling():
    scheduler = make_scheduler()
    sequence = scored_sequence("echo", 10, max_tokens=0)
    scheduler.add(sequence)
    plan = scheduler.schedule()
    commit(scheduler, plan)

    assert not plan.works[0].sample
    assert sequence.prefill_done and not sequence.needs_scoring
    assert scheduler.schedule() is None


def test_a_scored_head_of_queue_waits_for_a_scored_step():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    scheduler.add(scored_sequence("first", 8))
    scheduler.add(make_sequence("second", 8))
    plan = scheduler.schedule()
    assert plan.scored and [w.slot for w in plan.works] == [0]
    commit(scheduler, plan)
    plan = scheduler.schedule()
    assert not plan.scored  # the ordinary newcomer and the first one's decode row
    assert len(plan.works) == 2


def test_without_a_scored_limit_no_step_is_scored():
    scheduler = make_scheduler(scored_token_limit=0)
    scheduler.add(make_sequence("plain", 8))
    assert not scheduler.schedule().scored
