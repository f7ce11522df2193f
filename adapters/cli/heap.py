"""A served process's start-up heap, moved out of the cyclic collector's view."""

from __future__ import annotations

import gc


def freeze_start_up_heap() -> None:
    """Collects once, then freezes what start-up left (`gc.freeze`), so that later full
    collections walk only what serving allocated.

    A served process holds about 200,000 tracked objects after start-up (torch, the tokenizer,
    the app); each full collection walked them all in 100-200 ms with the GIL held, stalling
    every stream of the process, two or three times in 20 s at 64 streams (bench/host.py,
    docs/performance.md). Call it once the model or engine link is loaded.
    """
    gc.collect()
    gc.freeze()
