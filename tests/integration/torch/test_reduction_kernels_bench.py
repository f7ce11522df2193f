"""The per-launch GPU bench drives the reducer's kernels as the reducer does, checked on the CPU."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the kernels run in Triton's interpreter, which must be chosen before import.
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from adapters.gpu.logprobs.normalizer import LSE_TILE  # noqa: E402
from adapters.gpu.logprobs.reducer import ReductionInputs  # noqa: E402
from adapters.gpu.logprobs.triton_reducer import TritonLogprobReducer  # noqa: E402

BENCH = Path(__file__).resolve().parents[3] / "bench" / "reduction_kernels.py"


def bench_module():
    spec = importlib.util.spec_from_file_location("reduction_kernels", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchs_four_launches_write_the_words_of_the_reducer():
    # The bench repeats the reducer's launch arguments; a kernel that changes its own would
    # otherwise break the bench only on the next lent GPU, whose minutes are few.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    launches = bench_module().Launches(3, 3 * LSE_TILE - 72, device)
    for stage in ("stats", "normalize", "candidates", "merge", "bare"):
        getattr(launches, f"{stage}_launch")(4)
    out = torch.full_like(launches.out, -7)
    TritonLogprobReducer(launches.vocab).reduce(
        ReductionInputs(
            launches.logits,
            launches.slots,
            launches.positions,
            launches.chosen,
            launches.requested,
            None,
            None,
            out,
        )
    )

    assert torch.equal(launches.out, out)
    assert int(out[0, 0, 0]) == int(launches.chosen[0])
