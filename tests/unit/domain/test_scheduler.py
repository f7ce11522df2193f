"""Scheduling rules: budgets, chunked prefill, admission order, preemption by recompute."""

from __future__ import annotations

import pytest

from domain.contract.records import CompletionRecord, Role
from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.engine.sequence import Sequence, SequenceState
from domain.requests.choice_sampling import ChoiceSampling
from domain.requests.sampling import SamplingParams
from domain.telemetry.step_stats import SchedulerState


def make_sequence(request_id: str, prompt_len: int, max_tokens: int = 100) -> Sequence:
    return Sequence(
        request_id=request_id,
        index=0,
        prompt=tuple(range(1, prompt_len + 1)),
        sampling=ChoiceSampling(SamplingParams(max_tokens=100), 1, max_tokens),
    )


def make_scheduler(**overrides: int) -> Scheduler:
    limits = dict(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=4, num_blocks=32, max_model_len=64
    )
    limits.update(overrides)
    return Scheduler(SchedulerConfig(**limits))


def commit_all(scheduler: Scheduler, plan, token: int = 9) -> None:
    records = tuple(
        CompletionRecord(
            w.slot, w.epoch, Role.SAMPLE if w.sample else Role.PROMPT, (token,) if w.sample else ()
        )
        for w in plan.works
    )
    for sequence, record, _ in scheduler.commit(records):
        scheduler.extend(sequence, record.tokens)


def test_long_prompt_is_prefilled_in_chunks_within_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    sequence = make_sequence("a", 20)
    scheduler.add(sequence)

    chunks = []
    for _ in range(3):
        plan = scheduler.schedule()
        chunks.append(
            (plan.works[0].start_position, len(plan.works[0].token_ids), plan.works[0].sample)
        )
        commit_all(scheduler, plan)

    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert sequence.outputs == [9]


def test_decode_rows_of_running_sequences_come_before_new_admissions():
    scheduler = make_scheduler(max_num_batched_tokens=6)
    first = make_sequence("a", 5)
    scheduler.add(first)
    commit_all(scheduler, scheduler.schedule())
    scheduler.add(make_sequence("b", 10))

    plan = scheduler.schedule()

    assert [(w.slot, len(w.token_ids)) for w in plan.works] == [(first.cache.slot, 1), (1, 5)]


def test_admission_stops_when_every_slot_is_taken():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for name in "abc":
        scheduler.add(make_sequence(name, 3))

    plan = scheduler.schedule()

    assert len(plan.works) == 2
    assert scheduler.occupancy().waiting == 1


def test_running_out_of_blocks_preempts_the_newest_sequence_which_restarts_from_position_zero():
    scheduler = make_scheduler(
        num_blocks=4, block_size=4, max_num_batched_tokens=64, max_model_len=16
    )
    old, new = make_sequence("old", 7), make_sequence("new", 8)
    scheduler.add(old)
    scheduler.add(new)
    commit_all(scheduler, scheduler.schedule())  # old holds 2 blocks, new holds 2 blocks

    plan = scheduler.schedule()  # old needs a third block for position 8: new is preempted

    assert [w.slot for w in plan.works] == [old.cache.slot]
    assert new.state is SequenceState.WAITING and new.num_preemptions == 1
    assert new.cache.num_computed == 0 and new.cache.blocks == []
    assert new.outputs == [9]


def test_readmitted_sequence_reprefills_prompt_and_outputs_and_gets_a_new_epoch():
    scheduler = make_scheduler(
        num_blocks=4, block_size=4, max_num_batched_tokens=64, max_model_len=16
    )
    old, new = make_sequence("old", 7), make_sequence("new", 8)
    scheduler.add(old)
    scheduler.add(new)
    commit_all(scheduler, scheduler.schedule())
    first_epoch = new.cache.epoch
    commit_all(scheduler, scheduler.schedule())
    scheduler.finish(old)

    plan = scheduler.schedule()

    work = plan.works[0]
    assert work.token_ids == new.prompt + (9,) and work.start_position == 0 and work.sample
    assert new.cache.epoch != first_epoch or new.cache.slot is not None


def test_records_with_a_stale_epoch_are_ignored():
    scheduler = make_scheduler()
    sequence = make_sequence("a", 3)
    scheduler.add(sequence)
    plan = scheduler.schedule()
    work = plan.works[0]

    advanced = scheduler.commit((CompletionRecord(work.slot, work.epoch + 1, Role.SAMPLE, (5,)),))

    assert advanced == [] and sequence.outputs == []


def test_finishing_a_sequence_frees_its_slot_and_blocks_at_once():
    scheduler = make_scheduler()
    sequence = make_sequence("a", 9)
    scheduler.add(sequence)
    commit_all(scheduler, scheduler.schedule())
    assert scheduler.occupancy() == SchedulerState(running=1, kv_cache_usage=3 / 32)

    scheduler.finish(sequence)

    assert scheduler.occupancy() == SchedulerState() and not scheduler.has_work()


def test_a_kv_pool_smaller_than_one_full_sequence_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        make_scheduler(num_blocks=3, block_size=4, max_model_len=16)
