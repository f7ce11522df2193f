"""Runs a worker on every rank of a CPU gloo world and collects what each rank wrote as JSON."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.support.marker_guard import require
from tests.support.rank_processes import start_ranks


def spawn_worlds(
    worker: Callable[[int, int, str], None],
    worlds: Iterable[int],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[int, int], dict]:
    """(world, rank) -> the JSON `worker(rank, world, directory)` wrote to `rank<r>.json`.

    One start per world size; the worker must be a module-level function (it is pickled).
    """
    require("slow", "it spawned gloo worlds")
    found = {}
    for world in worlds:
        directory = tmp_path_factory.mktemp(f"world{world}")
        start_ranks(worker, (world, str(directory)), world)
        for rank in range(world):
            found[world, rank] = json.loads((directory / f"rank{rank}.json").read_text())
    return found


@contextmanager
def gloo_rank(rank: int, world: int, directory: str, timeout_s: float = 60) -> Iterator[dict]:
    """Joins this rank's gloo group and yields the results dict `spawn_worlds` will read.

    The dict is written even when the body raises, so the parent sees what finished.
    """
    # Several ranks share two cores: more threads per rank only contend.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{directory}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    results: dict = {}
    try:
        yield results
    finally:
        Path(directory, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def record_each(results: dict, names: Iterable[str], compute: Callable[[str], object]) -> None:
    """results[name] = compute(name); a scenario that raises is kept as {"error": traceback}.

    One failing scenario must not stop the others, or every rank's later results would be lost.
    """
    for name in names:
        try:
            results[name] = compute(name)
        except Exception:
            results[name] = {"error": traceback.format_exc()}


def refusal(call: Callable[[], object]) -> str | None:
    """The text of the ValueError `call()` raised, or None when it accepted."""
    try:
        call()
    except ValueError as error:
        return str(error)
    return None
