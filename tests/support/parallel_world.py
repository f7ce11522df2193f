"""Tensor-parallel worlds of spawned CPU processes for tests: rank 0 drives, peers run plans."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adapters.gpu.distributed.coordinator import CoordinatorExecutor
from adapters.gpu.distributed.group import RankGroup, Rendezvous, free_port
from adapters.gpu.distributed.launch import run_peer
from adapters.gpu.factory import ExecutorRecipe, RunnerSettings
from adapters.gpu.logprobs.completion_outputs import CompletionOutputs
from adapters.gpu.scoring.prompt_score_frames import PromptScoreFrames
from tests.support.marker_guard import require
from tests.support.rank_processes import start_ranks

# rank_main(rendezvous, directory, *arguments), a module-level function (it is pickled).
RankMain = Callable[..., None]


def spawn_world(world_size: int, directory: Path, rank_main: RankMain, *arguments: Any) -> None:
    """Runs rank_main on every rank of a fresh loopback world and waits for all of them."""
    require("slow", "it spawned a gloo world")
    rendezvous = Rendezvous("127.0.0.1", free_port(), world_size, 0, 0, timeout_s=120)
    start_ranks(_entry, (rendezvous, rank_main, str(directory), arguments), world_size)


def _entry(
    rank: int, rendezvous: Rendezvous, rank_main: RankMain, directory: str, arguments: tuple
) -> None:
    # Ranks share two cores: more threads per rank only contend.
    torch.set_num_threads(1)
    rank_main(rendezvous.for_rank(rank, rank), Path(directory), *arguments)


def settings(tensor_parallel_size: int, **overrides: Any) -> RunnerSettings:
    """The engine-test runner settings (block size 4, 8 MiB of KV) for a world size."""
    values: dict[str, Any] = {
        "device": "cpu",
        "max_num_seqs": 8,
        "max_model_len": 192,
        "kv_cache_bytes": 8 << 20,
        "block_size": 4,
        "tensor_parallel_size": tensor_parallel_size,
    }
    values.update(overrides)
    return RunnerSettings(**values)


def coordinate(
    rendezvous: Rendezvous, recipe: ExecutorRecipe, drive: Callable[[CoordinatorExecutor], Any]
) -> Any:
    """Rank 0: joins, sends the recipe, builds its executor and returns `drive(executor)`; the
    peers are told to stop afterwards."""
    group = RankGroup(rendezvous, torch.device("cpu"))
    group.send(recipe)
    executor = CoordinatorExecutor(recipe.build(group.collectives, 0), group)
    try:
        return drive(executor)
    finally:
        executor.close()


def peer(rendezvous: Rendezvous, directory: Path) -> None:
    """A peer rank: runs plans until rank 0 stops, then saves its exchange tally."""
    tally = run_peer(rendezvous, "cpu", rendezvous.world_size)
    save(directory, f"tally{rendezvous.rank}", tally)


def save(directory: Path, name: str, value: Any) -> None:
    (directory / f"{name}.pickle").write_bytes(pickle.dumps(value))


def load(directory: Path, name: str) -> Any:
    return pickle.loads((directory / f"{name}.pickle").read_bytes())


class ReductionCapture:
    """Records, on one rank, every logprob reduction's logits rows (this rank's lanes), the
    packed words it wrote for them and each row's flag and selected-ID count, and how many rows
    prompt scoring scored."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.scored_rows = 0

    def install(self) -> None:
        reduce = CompletionOutputs.reduce
        score = PromptScoreFrames.score
        capture = self

        def scoring(frames, frame, hidden, targets, lanes, project):
            capture.scored_rows += len(targets)
            score(frames, frame, hidden, targets, lanes, project)

        def recording(outputs, frame, logits, rows, slots, positions, chosen):
            reduce(outputs, frame, logits, rows, slots, positions, chosen)
            buffers = outputs.buffers
            picked = logits.index_select(0, torch.tensor(rows, dtype=torch.int64)).clone()
            words = buffers.logprobs[frame][slots, positions].clone()
            counts = [0] * len(slots)
            if buffers.counts is not None:
                counts = buffers.counts[slots].tolist()
            requested = buffers.requested[slots].tolist()
            capture.calls.append(
                {
                    "logits": picked,
                    "words": words,
                    "chosen": list(chosen),
                    "counts": counts,
                    "requested": requested,
                }
            )

        CompletionOutputs.reduce = recording  # type: ignore[method-assign]
        PromptScoreFrames.score = scoring  # type: ignore[method-assign]
