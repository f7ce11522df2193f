"""The scored-prefill storage: which rows of which frame a plan writes, and what a read returns."""

from __future__ import annotations

import pytest
import torch

from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from domain.logprobs.prompt_scores import INVALID_BITS, PROMPT_ROW_WORDS

VOCAB = 300
HIDDEN = 16
SENTINEL = 0x5A5A5A5A


def _project(head: torch.Tensor):
    return lambda rows: rows @ head.T


def test_a_plan_writes_only_its_frame_up_to_the_capacity_that_holds_it():
    frames = PromptScoreFrames((128, 512), VOCAB, torch.device("cpu"))
    frames.prompt_logprobs.fill_(SENTINEL)
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))
    hidden = torch.randn(50, HIDDEN, generator=torch.Generator().manual_seed(1))
    targets = list(range(1, 50)) + [-1]

    frames.score(0, hidden, targets, [20, 30], _project(head))

    written = frames.prompt_logprobs[0]
    assert (written[:50, 0] == torch.tensor(targets[:49] + [-1], dtype=torch.int32)).all()
    padding = written[50:128]
    assert (padding[:, 0] == -1).all() and (padding[:, 1] == INVALID_BITS).all()
    assert (padding[:, 2] == 0).all() and (padding[:, 3::2] == -1).all()
    assert (written[128:] == SENTINEL).all(), "rows past the capacity stay untouched"
    assert (frames.prompt_logprobs[1] == SENTINEL).all(), "the other frame stays untouched"
    assert frames.prompt_logprobs.shape == (2, 512, PROMPT_ROW_WORDS)


def test_reading_a_frame_splits_rows_by_lane_and_retires_it():
    frames = PromptScoreFrames((128,), VOCAB, torch.device("cpu"))
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2))
    hidden = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(3))

    frames.score(1, hidden, [7, 8, -1, 9, -1], [3, 2], _project(head))
    lanes = frames.read(1)

    assert [len(lane) for lane in lanes] == [3, 2]
    assert [s.token_id if s else None for s in lanes[0]] == [7, 8, None]
    assert [s.token_id if s else None for s in lanes[1]] == [9, None]
    assert frames.read(1) == ()


def test_a_plan_larger_than_the_largest_capacity_is_refused():
    frames = PromptScoreFrames((4,), VOCAB, torch.device("cpu"))
    hidden = torch.zeros(5, HIDDEN)
    with pytest.raises(ValueError, match="largest capacity 4"):
        frames.score(0, hidden, [1] * 5, [5], lambda rows: torch.zeros(rows.shape[0], VOCAB))


def test_fixed_bytes_count_both_frames_the_targets_and_the_pooled_block():
    assert PromptScoreFrames.fixed_bytes((128, 512), 49_152) == (
        2 * 512 * 43 * 4 + 512 * 4 + 64 * 49_152 * 4
    )
