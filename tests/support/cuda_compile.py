"""Compiles the Triton logprob kernels for a CUDA GPU on a machine without one.

`python -m tests.support.cuda_compile` (with TRITON_INTERPRET unset: the interpreter's kernels
cannot be compiled) builds every kernel of `triton_reducer.py` and `triton_launches_vp.py` for
sm_90, with and without selected IDs, and prints one line per kernel; the exit status is the
number of kernels that failed. The interpreter runs kernels as Python and never meets what
only the compiler refuses (a name bound to two shapes in two branches, for instance). A kernel
that compiles with a stack frame fails too: its registers spill to local memory. Triton 3.6
lowered the old tile tree (ten levels of `tl.split`) to a 5,840-byte stack a thread, and the
reducer ran at 1,800x the bytes floor on an H200. Run it under another Triton with
`PYTHONPATH=DIR` after `pip install --target DIR triton==VERSION`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from adapters.gpu.logprobs import triton_launches_vp as launches
from adapters.gpu.logprobs import triton_reducer as reducer

TARGET = GPUTarget("cuda", 90, 32)
# Argument types by parameter name; every other runtime argument is an int32 scalar.
POINTERS = {
    "logits": "*bf16",
    "requested": "*i32",
    "slots": "*i32",
    "positions": "*i32",
    "chosen": "*i32",
    "counts": "*i32",
    "token_ids": "*i32",
    "out": "*i32",
    "send": "*i32",
    "gathered": "*i32",
    "stats": "*fp32",
    "lse": "*fp32",
    "keys": "*i64",
    "send_keys": "*i64",
    "gathered_keys": "*i64",
    "tile_words": "*i64",
    "stops": "*i64",
}


def kernels(has_ids: bool) -> list[tuple[str, object, dict[str, object]]]:
    """(name, kernel, constexpr arguments) of every launch, as the reducers size them."""
    merge = {"HAS_IDS": has_ids, "SELECTED": 128, "CANDIDATES": 32, "TOP_K": 20}
    exchange = {"WORDS": 256, "VALUE_WORD": 64, "CHOSEN_WORD": 128}
    return [
        ("tile_stats", reducer.tile_stats_kernel, {"TILE": 1024, "LOG2_TILE": 10}),
        ("normalize", reducer._normalize_kernel, {"TILES_BLOCK": 256}),
        (
            "tile_candidates",
            reducer.tile_candidates_kernel,
            {"HAS_IDS": has_ids, "TILE": 1024, "CANDIDATES": 32},
        ),
        ("merge", reducer._merge_kernel, {**merge, "CANDIDATES_BLOCK": 8192}),
        ("vp_pack_statistics", launches._pack_statistics_kernel, {"WORDS": 256}),
        ("vp_combine", launches._combine_kernel, {"TILES_BLOCK": 256, "WORDS": 256}),
        (
            "vp_pack_candidates",
            launches._pack_candidates_kernel,
            {"HAS_IDS": has_ids, "CANDIDATES": 32, "CANDIDATES_BLOCK": 4096, "SELECTED": 128}
            | exchange,
        ),
        (
            "vp_final_merge",
            launches._final_merge_kernel,
            {**merge, **exchange, "CANDIDATES_BLOCK": 64, "WORLD_BLOCK": 2},
        ),
    ]


def stack_bytes(cubin: bytes) -> int | None:
    """The largest stack frame of the cubin's kernels, by the cuobjdump Triton ships (None
    when it is missing or reports none)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.access(tool, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([tool, "-res-usage", file.name], capture_output=True, text=True)
    frames = [int(size) for size in re.findall(r"STACK:(\d+)", usage.stdout)]
    return max(frames) if frames else None


def compile_error(kernel: object, constants: dict[str, object]) -> str | None:
    """The compiler's last line when `kernel` fails to compile for TARGET, or why its code
    spills, else None."""
    names = kernel.arg_names  # type: ignore[attr-defined]
    signature = {
        name: "constexpr" if name in constants else POINTERS.get(name, "i32") for name in names
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    try:
        compiled = triton.compile(source, target=TARGET, options={"enable_fp_fusion": False})
    except Exception as error:  # the compiler raises several kinds; each is one failed kernel
        return str(error).strip().splitlines()[-1]
    frame = stack_bytes(compiled.asm["cubin"])
    if frame is None:
        return "its stack frame could not be read: this Triton ships no cuobjdump"
    if frame:
        return f"spills: a {frame}-byte stack frame a thread"
    return None


def main() -> int:
    failures = 0
    for has_ids in (False, True):
        for name, kernel, constants in kernels(has_ids):
            error = compile_error(kernel, constants)
            failures += error is not None
            print(f"{name} (HAS_IDS={has_ids}): {error or 'compiles'}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
