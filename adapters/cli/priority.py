"""Lowers an API process's CPU priority below the engine process's, where CPUs are short."""

from __future__ import annotations

import contextlib
import os


def yield_cpu_to_engine(increment: int) -> None:
    """Adds `increment` to this process's nice value (from its main thread, before it starts
    any other: Linux keeps a nice value per thread, and new threads inherit their creator's).

    With `--api-server-count` above 1 the engine process keeps the device fed and the API
    processes turn its outputs into HTTP. Where they share too few cores, a step that waits for
    a core leaves the device idle, while an API process that waits only delays its frames a
    little: on the 2-core box the simulated 7 ms step ran more steps a second in every pair
    with the API processes at nice 5, and delivered more tokens in 11 pairs of 12
    (docs/performance.md, "the engine first"). Where cores are plenty the nice value changes
    nothing. Raising one's own nice value needs no privilege; a system that refuses it leaves
    the priority as it was.
    """
    if increment <= 0:
        return
    with contextlib.suppress(OSError, AttributeError):
        os.nice(increment)
