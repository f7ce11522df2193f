"""Runs a worker on every rank of a CPU gloo world and collects what each rank wrote as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import pytest
import torch.multiprocessing as mp


def spawn_worlds(
    worker: Callable[[int, int, str], None],
    worlds: Iterable[int],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[int, int], dict]:
    """(world, rank) -> the JSON `worker(rank, world, directory)` wrote to `rank<r>.json`.

    One spawn per world size; the worker must be a module-level function (spawn pickles it).
    """
    found = {}
    for world in worlds:
        directory = tmp_path_factory.mktemp(f"world{world}")
        mp.start_processes(worker, args=(world, str(directory)), nprocs=world, start_method="spawn")
        for rank in range(world):
            found[world, rank] = json.loads((directory / f"rank{rank}.json").read_text())
    return found
