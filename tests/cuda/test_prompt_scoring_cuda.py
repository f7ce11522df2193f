"""On CUDA: scored prefill storage matches the CPU reference and reads back via pinned frames."""

from __future__ import annotations

import pytest
import torch

from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from adapters.gpu.scoring.prompt_scorer import PromptScorer
from domain.logprobs.prompt_scores import PROMPT_ROW_WORDS, unpack_prompt_row

pytestmark = pytest.mark.gpu

VOCAB = 49_152  # SmolLM2's vocabulary
HIDDEN = 64
ROWS = 200  # four projection blocks, the last partial


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    head = torch.randn(VOCAB, HIDDEN, generator=generator) * 0.5
    hidden = torch.randn(ROWS, HIDDEN, generator=generator)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator).tolist()
    targets[-1] = -1  # the prompt end
    return head, hidden, targets


def test_cuda_frames_score_like_the_cpu_reference_within_fp32_rounding():
    head, hidden, targets = _inputs(0)
    frames = PromptScoreFrames((128, 512), VOCAB, torch.device("cuda"))
    cuda_head = head.cuda()
    frames.score(1, hidden.cuda(), targets, [120, 80], lambda rows: rows @ cuda_head.T)
    lanes = frames.read(1)

    expected = torch.empty(ROWS, PROMPT_ROW_WORDS, dtype=torch.int32)
    PromptScorer(VOCAB).score(
        hidden, torch.tensor(targets, dtype=torch.int32), lambda rows: rows @ head.T, expected
    )
    scores = [score for lane in lanes for score in lane]
    assert [len(lane) for lane in lanes] == [120, 80]
    for row, score in zip(expected.tolist(), scores, strict=True):
        reference = unpack_prompt_row(row)
        if reference is None:
            assert score is None
            continue
        assert score.token_id == reference.token_id
        assert score.logprob == pytest.approx(reference.logprob, abs=1e-4)
        assert abs(score.rank - reference.rank) <= 1  # only near-ties may swap across devices
        assert len(score.alternatives) == 20


def test_pinned_readback_waits_for_the_producing_frame():
    head, hidden, targets = _inputs(1)
    frames = PromptScoreFrames((128, 512), VOCAB, torch.device("cuda"))
    cuda_head, cuda_hidden = head.cuda(), hidden.cuda()
    for frame in (0, 1):
        frames.score(frame, cuda_hidden, targets, [ROWS], lambda rows: rows @ cuda_head.T)
    first, second = frames.read(0), frames.read(1)
    assert first == second and len(first[0]) == ROWS
    assert frames.read(0) == ()  # a frame is retired once decoded
