"""The grammar catch-up: when a lane's matcher restarts, and which fed tokens it still takes."""

from __future__ import annotations

import json

from domain.contract.capabilities import NO_LOGPROBS
from domain.engine.step import SlotWork
from domain.requests.choice_sampling import LaneSampling
from domain.requests.sampling import SamplingParams
from domain.speculation.choice import DraftLane
from domain.structured.catch_up import CatchUp, grammar_catch_up
from domain.structured.constraint import GrammarLane
from domain.structured.grammar import GrammarKind, GrammarSpec

CHOICE = GrammarSpec(GrammarKind.CHOICE, json.dumps(["abc"]))


def lane(
    token_ids: tuple[int, ...],
    start_position: int,
    *,
    epoch: int = 1,
    prompt_len: int = 3,
    grammar_start: int | None = None,
    drafts: tuple[int, ...] = (),
) -> SlotWork:
    return SlotWork(
        slot=0,
        epoch=epoch,
        token_ids=token_ids,
        start_position=start_position,
        block_table=(0, 1, 2, 3),
        prompt_len=prompt_len,
        sample=True,
        sampling=LaneSampling(SamplingParams(), 0, remaining=8),
        speculation=DraftLane(drafts=drafts) if drafts else None,
        grammar=GrammarLane(CHOICE, prompt_len if grammar_start is None else grammar_start),
    )


def test_a_lane_without_a_matcher_starts_one_and_takes_nothing_of_its_prompt():
    assert grammar_catch_up(lane((1, 2, 3), 0), None, 0) == CatchUp(True, ())


def test_a_decoding_lane_feeds_the_token_its_matcher_already_took():
    # Position 4's token was emitted and accepted at commit: generated = 2 (positions 3, 4).
    assert grammar_catch_up(lane((9,), 4), 1, 2) == CatchUp(False, ())


def test_a_new_epoch_restarts_and_takes_every_re_fed_output():
    readmitted = lane((1, 2, 3, 7, 8), 0, epoch=2)

    assert grammar_catch_up(readmitted, 1, 2) == CatchUp(True, (7, 8))


def test_a_chunk_at_position_zero_restarts_even_at_the_same_epoch():
    # Another engine over the same executor counts epochs afresh: a stale matcher at epoch 1
    # that took 1 token must not skip this sequence's first output.
    again = lane((1, 2, 3, 7, 8), 0, prompt_len=3)

    assert grammar_catch_up(again, 1, 1) == CatchUp(True, (7, 8))


def test_a_resumed_chunk_takes_only_the_outputs_its_matcher_has_not_seen():
    # Outputs at 3, 4 re-fed from position 2 in the same epoch; the matcher took position 3.
    assert grammar_catch_up(lane((3, 7, 8), 2), 1, 1) == CatchUp(False, (8,))


def test_a_grammar_after_reasoning_walks_from_its_start_only():
    # Prompt 0-2, reasoning 3-4, the grammar from 5 on: a readmission re-feeds all of it.
    readmitted = lane((1, 2, 3, 5, 6, 7, 8), 0, epoch=2, grammar_start=5)

    assert grammar_catch_up(readmitted, None, 0) == CatchUp(True, (7, 8))


def test_a_lane_that_has_fed_nothing_its_grammar_walks_starts_fresh_at_its_epoch():
    # The reasoning ended at 4; the grammar begins at 5, where this lane emits first. A matcher
    # of the same epoch is stale (it belonged to an earlier life of the slot).
    first = lane((6,), 4, grammar_start=5)

    assert grammar_catch_up(first, 1, 3) == CatchUp(True, ())


def test_drafts_are_never_caught_up():
    speculating = lane((8, 4, 5), 4, drafts=(4, 5))

    assert grammar_catch_up(speculating, 1, 1) == CatchUp(False, (8,))


def letter(token_id: int) -> str:
    return chr(ord("a") + token_id % 26)


def test_the_fake_restarts_a_matcher_at_position_zero_as_the_grammar_lanes_do():
    from domain.engine.step import StepPlan
    from tests.fakes import FakeExecutor, FakeGrammarCompiler
    from tests.support.geometry import fake_geometry

    geometry = fake_geometry(
        logprobs=NO_LOGPROBS, capacity=2, num_blocks=16, max_model_len=32, token_capacity=4
    )
    executor = FakeExecutor(geometry, grammars=FakeGrammarCompiler())

    def step(work: SlotWork) -> tuple[int, ...]:
        return executor.read(executor.submit(StepPlan((work,)))).records[0].tokens

    (first,) = step(lane((1, 2, 3), 0))
    (second,) = step(lane((first,), 3))
    assert letter(first) + letter(second) == "ab"
    # Another engine over this executor: the same slot and epoch, its sequence re-fed from
    # position 0 with one output. The matcher that took "ab" is stale; a fresh one takes "a".
    (third,) = step(lane((1, 2, 3, first), 0))

    assert letter(third) == "b"
