"""Per-launch timings of the Triton logprob reducer on a GPU, with warp-count variants.

Run (CUDA only): `python3 bench/reduction_kernels.py [--rows 8,64,256] [--vocab 151936]`.
`bench/reduction.py` times the whole reducer against the floor and vLLM's torch path; this one
says where that time goes. For each row count it times each of the four launches alone
(`triton.testing.do_bench`, median), at the warp counts the reducer uses and at others. It
checks that every variant writes the default's words (warp counts cannot move the bits: every
sum follows an explicit tree or a loop), then prints the reducer's kernels as the torch profiler
sees them. It also times a bare pass (read each tile, keep its maximum) as a measured one-read
cost beside the clone floor.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.gpu.logprobs import triton_reducer as kernels  # noqa: E402
from adapters.gpu.logprobs.keys import CANDIDATES_PER_TILE  # noqa: E402
from adapters.gpu.logprobs.normalizer import LSE_TILE  # noqa: E402
from domain.logprobs.values import MAX_SELECTED_IDS, NATURAL_TOP_K  # noqa: E402

WARPS = (2, 4, 8, 16)


@triton.jit
def _bare_pass_kernel(logits, row_stride, peaks, vocab, tiles, TILE: tl.constexpr):
    row, tile = tl.program_id(0), tl.program_id(1)
    lanes = tile * TILE + tl.arange(0, TILE)
    x = tl.load(logits + row.to(tl.int64) * row_stride + lanes, mask=lanes < vocab, other=0.0)
    tl.store(peaks + row * tiles + tile, tl.max(x.to(tl.float32), 0))


class Launches:
    """The reducer's four launches over one batch, each callable alone with a warp count."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        generator = torch.Generator(device="cpu").manual_seed(rows)
        logits = (torch.randn(rows, vocab, generator=generator) * 4).to(torch.bfloat16)
        self.logits = logits.to(device)
        self.slots = torch.arange(rows, dtype=torch.int32, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int32, device=device)
        self.chosen = torch.randint(vocab, (rows,), generator=generator).to(device, torch.int32)
        self.requested = torch.ones(rows, dtype=torch.int32, device=device)
        self.out = torch.zeros(rows, 1, 2 + 2 * NATURAL_TOP_K, dtype=torch.int32, device=device)
        self.rows, self.vocab = rows, vocab
        self.tiles = -(-vocab // LSE_TILE)
        self.stats = torch.empty(rows, self.tiles, 2, dtype=torch.float32, device=device)
        self.keys = torch.empty(
            rows, self.tiles, CANDIDATES_PER_TILE, dtype=torch.int64, device=device
        )
        self.lse = torch.empty(rows, dtype=torch.float32, device=device)
        self.peaks = torch.empty(rows, self.tiles, dtype=torch.float32, device=device)
        self.common = {"enable_fp_fusion": False}

    def stats_launch(self, warps: int) -> None:
        kernels.tile_stats_kernel[(self.rows, self.tiles)](
            self.logits, self.logits.stride(0), self.slots, self.requested, self.stats,
            self.vocab, self.tiles, TILE=LSE_TILE, LOG2_TILE=kernels.TILE_TREE_LEVELS,
            num_warps=warps, **self.common,
        )  # fmt: skip

    def normalize_launch(self, warps: int) -> None:
        kernels._normalize_kernel[(self.rows,)](
            self.slots, self.requested, self.stats, self.lse, self.tiles,
            TILES_BLOCK=triton.next_power_of_2(self.tiles), num_warps=warps, **self.common,
        )  # fmt: skip

    def candidates_launch(self, warps: int) -> None:
        kernels.tile_candidates_kernel[(self.rows, self.tiles)](
            self.logits, self.logits.stride(0), self.slots, self.requested, self.requested,
            self.lse, self.keys, 0, self.vocab, self.tiles, HAS_IDS=False, TILE=LSE_TILE,
            CANDIDATES=CANDIDATES_PER_TILE, num_warps=warps, **self.common,
        )  # fmt: skip

    def merge_launch(self, warps: int) -> None:
        kernels._merge_kernel[(self.rows,)](
            self.logits, self.logits.stride(0), self.slots, self.positions, self.chosen,
            self.requested, self.requested, self.requested, self.lse, self.keys, self.out,
            self.out.shape[1], self.out.shape[2], self.vocab, self.tiles, HAS_IDS=False,
            TOP_K=NATURAL_TOP_K,
            CANDIDATES_BLOCK=triton.next_power_of_2(self.tiles * CANDIDATES_PER_TILE),
            CANDIDATES=CANDIDATES_PER_TILE, SELECTED=MAX_SELECTED_IDS, num_warps=warps,
            **self.common,
        )  # fmt: skip

    def bare_launch(self, warps: int) -> None:
        _bare_pass_kernel[(self.rows, self.tiles)](
            self.logits, self.logits.stride(0), self.peaks, self.vocab, self.tiles,
            TILE=LSE_TILE, num_warps=warps,
        )  # fmt: skip

    def written(self, stage: str) -> torch.Tensor:
        """The words a stage writes, to compare variants."""
        tensor = {"stats": self.stats, "normalize": self.lse, "candidates": self.keys}.get(
            stage, self.out
        )
        return tensor.clone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="8,64,256")
    parser.add_argument("--vocab", type=int, default=151_936)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA only: no GPU here")
        return 1
    stages = ("stats", "normalize", "candidates", "merge")
    lines = ["| rows | stage | " + " | ".join(f"{w} warps ms" for w in WARPS) + " |"]
    lines.append("|" + "---|" * (2 + len(WARPS)))
    for rows in (int(part) for part in args.rows.split(",")):
        launches = Launches(rows, args.vocab, torch.device("cuda"))
        cells: dict[str, list[str]] = {}
        for stage in (*stages, "bare"):
            launch = getattr(launches, f"{stage}_launch")
            launch(4)
            torch.cuda.synchronize()
            expected = launches.written(stage)
            cells[stage] = []
            for warps in WARPS:
                try:
                    launch(warps)
                    torch.cuda.synchronize()
                    same = stage == "bare" or torch.equal(launches.written(stage), expected)
                    ms = do_bench(partial(launch, warps), warmup=10, rep=60, return_mode="median")
                    cells[stage].append(f"{ms:.4f}" + ("" if same else " (DIFFERS)"))
                except Exception as error:  # one failing variant must not lose the table
                    cells[stage].append(f"failed: {type(error).__name__}")
                finally:
                    launch(4)  # later stages read the default's words
            torch.cuda.synchronize()
            lines.append(f"| {rows} | {stage} | " + " | ".join(cells[stage]) + " |")
            print(lines[-1], flush=True)  # a run cut short by its timeout keeps what it measured
        print(f"measured {rows} rows", file=sys.stderr, flush=True)
        if rows == max(int(part) for part in args.rows.split(",")):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    for stage in stages:
                        getattr(launches, f"{stage}_launch")(4)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
    name = torch.cuda.get_device_name()
    print(f"device: {name}; triton {triton.__version__}; vocab {args.vocab}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
