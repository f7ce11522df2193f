"""Under a model whose every layer has a sliding window, blocks wholly outside it go back to the
pool while the sequence runs; with the prefix cache they stay findable once published."""

from __future__ import annotations

import pytest

from domain.contract.records import CompletionRecord, Role
from domain.engine.scheduler import Scheduler, SchedulerConfig
from domain.engine.sequence import Sequence
from domain.requests.choice_sampling import ChoiceSampling
from domain.requests.sampling import SamplingParams

BLOCK = 4
WINDOW = 8
NUM_BLOCKS = 40


def _sequence(request_id: str, prompt: tuple[int, ...], max_tokens: int) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens)
    return Sequence(request_id, 0, prompt, ChoiceSampling(params, 1, max_tokens))


def _scheduler(window: int | None, caching: str | None = None) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=8,
        block_size=BLOCK,
        num_blocks=NUM_BLOCKS,
        max_model_len=160,
        prefix_caching=caching,
        kv_window=window,
    )
    return Scheduler(config)


def _run(
    sequence: Sequence, window: int | None, caching: bool = False
) -> tuple[Scheduler, list[int]]:
    """Steps `sequence` to its end on a fresh scheduler, sampling token 7 each time, checking
    the window's rule after each step; returns the scheduler and the blocks the pool had handed
    out after each step."""
    scheduler = _scheduler(window, "sha256" if caching else None)
    scheduler.add(sequence)
    held = []
    while sequence.remaining > 0:
        plan = scheduler.schedule()
        assert plan is not None
        records = tuple(
            CompletionRecord(
                w.slot, w.epoch, Role.SAMPLE if w.sample else Role.PROMPT, (7,) if w.sample else ()
            )
            for w in plan.works
        )
        for running, record, _ in scheduler.commit(records):
            scheduler.extend(running, record.tokens)
        if window is not None:
            _check_window_rule(sequence, caching)
        held.append(_held(scheduler))
    scheduler.finish(sequence)
    return scheduler, held


def _check_window_rule(sequence: Sequence, caching: bool) -> None:
    """The blocks given back are exactly those wholly before the first position a query from
    `num_computed` on can see (short of unpublished ones under the prefix cache)."""
    cache = sequence.cache
    invisible = max(0, cache.num_computed - WINDOW + 1) // BLOCK
    expected = min(invisible, cache.published) if caching else invisible
    assert cache.dropped == expected, (cache.num_computed, cache.dropped, expected)


def _held(scheduler: Scheduler) -> int:
    return round(scheduler.occupancy().kv_cache_usage * NUM_BLOCKS)


@pytest.mark.parametrize("caching", [False, True])
def test_a_long_generation_holds_only_the_blocks_its_window_can_see(caching: bool) -> None:
    scheduler, held = _run(_sequence("a", tuple(range(1, 18)), max_tokens=120), WINDOW, caching)
    # The window's positions, the block being written and one partly outside the window.
    assert max(held) <= WINDOW // BLOCK + 2
    assert _held(scheduler) == 0


def test_without_a_window_every_block_stays_until_the_end() -> None:
    _, held = _run(_sequence("a", tuple(range(1, 18)), max_tokens=120), None)
    assert max(held) == -(-(17 + 120 - 1) // BLOCK)


def test_dropped_blocks_stay_in_the_prefix_cache_for_the_next_request() -> None:
    prompt = tuple(range(1, 30))
    scheduler, _ = _run(_sequence("a", prompt, max_tokens=20), WINDOW, caching=True)
    again = _sequence("b", prompt, max_tokens=1)
    scheduler.add(again)
    plan = scheduler.schedule()
    assert plan is not None
    # Every full block of the prompt short of its last token is found, though "a" gave its
    # first ones back long before it finished.
    assert plan.works[0].start_position == (len(prompt) - 1) // BLOCK * BLOCK
