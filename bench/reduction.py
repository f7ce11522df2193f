"""Logprob reduction cost per call against vLLM's torch path and the one-read bytes floor.

Run: `.venv/bin/python bench/reduction.py [--rows 1,8,64,256] [--vocab 151936] [--seconds S]`.
On CUDA when available, else on CPU (where rows are capped at 64 unless --rows says otherwise).
For each row count it times, on bf16 logits [rows, vocab] with every row requesting natural K=20:
the reference reducer (`ReferenceLogprobReducer`), the torch baseline vLLM runs (FP32 upcast,
log_softmax, topk(20), gather of the chosen token), `TritonLogprobReducer` when
`adapters/gpu/logprobs/triton_reducer.py` provides one (CUDA only), and the bytes floor: one
read of the logits at the bandwidth a clone of the same tensor achieves (a clone reads and
writes, so the floor is half the clone time). Each candidate cycles through several copies of
the logits so that no call finds its input in cache; the median per-call time is reported (CUDA
events on the GPU, time.perf_counter on the CPU), after warm-up calls.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.gpu.logprobs.reducer import ReductionInputs  # noqa: E402
from adapters.gpu.logprobs.reference_reducer import ReferenceLogprobReducer  # noqa: E402
from domain.logprobs.values import NATURAL_TOP_K  # noqa: E402

CPU_ROW_CAP = 64
ROTATION_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}
MAX_COPIES = 256


def torch_baseline(logits: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What vLLM's sampler does for logprobs: full FP32 log_softmax, top-k, chosen gather."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logprobs, NATURAL_TOP_K, dim=-1)
    return top.values, top.indices, logprobs.gather(-1, chosen[:, None])


class Inputs:
    """Rotated logits copies plus the replicated row inputs of an all-requesting batch."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        generator = torch.Generator(device="cpu").manual_seed(rows)
        bytes_each = rows * vocab * 2
        copies = max(2, min(MAX_COPIES, -(-ROTATION_BYTES[device.type] // bytes_each)))
        self.logits = [
            (torch.randn(rows, vocab, generator=generator) * 4).to(torch.bfloat16).to(device)
            for _ in range(copies)
        ]
        self.slots = torch.arange(rows, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.chosen = torch.randint(vocab, (rows,), generator=generator).to(device)
        self.requested = torch.ones(rows, dtype=torch.int32, device=device)
        self.out = torch.zeros(rows, 1, 2 + 2 * NATURAL_TOP_K, dtype=torch.int32, device=device)
        self.bytes = bytes_each

    def baseline_call(self) -> Callable[[torch.Tensor], object]:
        return lambda logits: torch_baseline(logits, self.chosen)

    def reducer_call(self, reducer) -> Callable[[torch.Tensor], None]:
        def call(logits: torch.Tensor) -> None:
            reducer.reduce(
                ReductionInputs(
                    logits,
                    self.slots,
                    self.positions,
                    self.chosen,
                    self.requested,
                    None,
                    None,
                    self.out,
                )
            )

        return call


def median_ms(
    call: Callable[[torch.Tensor], object], inputs: Inputs, device: torch.device, seconds: float
) -> float:
    """Median milliseconds of one call, after warm-up, cycling through the input copies."""
    copies = inputs.logits
    warm_up = 10 if device.type == "cuda" else 2
    started = time.perf_counter()
    for index in range(warm_up):
        call(copies[index % len(copies)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    per_call = (time.perf_counter() - started) / warm_up
    repetitions = max(5, min(200, int(seconds / max(per_call, 1e-6))))
    samples = []
    for index in range(repetitions):
        logits = copies[index % len(copies)]
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call(logits)
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end))
        else:
            begin_s = time.perf_counter()
            call(logits)
            samples.append((time.perf_counter() - begin_s) * 1e3)
    return statistics.median(samples)


def triton_reducer_class(device: torch.device) -> tuple[type | None, str]:
    """The Triton reducer class when it exists and this is CUDA, else None and why not."""
    if device.type != "cuda":
        return None, "Triton reducer not measured: CUDA only"
    try:
        module = importlib.import_module("adapters.gpu.logprobs.triton_reducer")
        return module.TritonLogprobReducer, ""
    except (ImportError, AttributeError) as error:
        return None, f"Triton reducer not measured: {error}"


def bench(rows_list: list[int], vocab: int, device: torch.device, seconds: float) -> None:
    triton_class, triton_note = triton_reducer_class(device)
    header = ["rows", "logits MiB", "floor ms", "torch ms", "reference ms"]
    header += ["triton ms"] if triton_class else []
    header += ["ref / floor", "ref / torch"]
    header += ["triton / floor", "triton / torch"] if triton_class else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rows in rows_list:
        inputs = Inputs(rows, vocab, device)
        clone = median_ms(torch.clone, inputs, device, seconds)
        floor = clone / 2
        baseline = median_ms(inputs.baseline_call(), inputs, device, seconds)
        reducer = ReferenceLogprobReducer(vocab, NATURAL_TOP_K)
        reference = median_ms(inputs.reducer_call(reducer), inputs, device, seconds)
        cells = [f"{rows}", f"{inputs.bytes / 2**20:.1f}"]
        cells += [f"{floor:.3f}", f"{baseline:.3f}", f"{reference:.3f}"]
        triton = None
        if triton_class:
            try:
                call = inputs.reducer_call(triton_class(vocab, NATURAL_TOP_K))
                triton = median_ms(call, inputs, device, seconds)
            except Exception as error:  # a broken candidate must not lose the other rows
                triton_note = f"Triton reducer failed at {rows} rows: {error!r}"
            cells.append(f"{triton:.3f}" if triton is not None else "failed")
        cells += [f"{reference / floor:.1f}x", f"{reference / baseline:.2f}x"]
        if triton is not None:
            cells += [f"{triton / floor:.1f}x", f"{triton / baseline:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
        print(f"measured {rows} row(s)", file=sys.stderr, flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    print(f"device: {device.type} ({name}{threads}); torch {torch.__version__}; vocab {vocab}")
    print("bf16 logits, all rows requesting, natural K=20; floor = clone time / 2\n")
    print("\n".join(lines))
    if triton_note:
        print(f"\n{triton_note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="comma-separated row counts")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="time budget per measurement (default 1 GPU, 2 CPU)",
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.rows:
        rows_list = [int(part) for part in args.rows.split(",")]
    else:
        rows_list = [1, 8, 64, 256]
        if device.type == "cpu":
            rows_list = [rows for rows in rows_list if rows <= CPU_ROW_CAP]
            print(f"CPU run: rows capped at {CPU_ROW_CAP} (pass --rows to override)")
    seconds = args.seconds or (1.0 if device.type == "cuda" else 2.0)
    bench(rows_list, args.vocab, device, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
