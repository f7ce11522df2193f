"""Starts test worlds' rank processes from one forkserver that has imported torch already."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

# Imported once per test process by the forkserver instead of once per rank (about 1.5 s of
# CPU each). Nothing that reads the environment at import to pick a mode (Triton reads
# TRITON_INTERPRET) may be here: ranks set such switches before their own imports.
PRELOAD = ["torch", "torch.distributed", "numpy"]


def start_ranks(entry: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Runs `entry(rank, *args)` in `nprocs` fresh processes and waits for all of them.

    Each rank is forked from the forkserver, a fresh interpreter that only imported PRELOAD and
    never ran a tensor op (torch starts its intra-op pool at the first one, in the rank), then
    takes this process's working directory and environment, as a spawned one would. `entry`
    must be module-level: it is pickled, as for spawn.
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(
        _as_spawned,
        args=(entry, os.getcwd(), dict(os.environ), args),
        nprocs=nprocs,
        start_method="forkserver",
    )


def _as_spawned(
    rank: int,
    entry: Callable[..., None],
    cwd: str,
    environment: dict[str, str],
    args: tuple[Any, ...],
) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    entry(rank, *args)
