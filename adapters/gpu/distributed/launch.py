"""Starting a tensor-parallel world: rank 0 spawns its local peers, every peer runs plans."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import adapters
from adapters.gpu.distributed.collectives import ExchangeTally
from adapters.gpu.distributed.coordinator import CoordinatorExecutor
from adapters.gpu.distributed.devices import CudaRuntime, claim_device
from adapters.gpu.distributed.group import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    RankGroup,
    Rendezvous,
    free_port,
)
from adapters.gpu.factory import ExecutorRecipe
from adapters.grammar.llguidance_compiler import LlguidanceCompiler

_log = logging.getLogger(__name__)


def _share_cores(local_ranks: int, device: torch.device) -> None:
    # Ranks on one machine's CPUs would fight over every core; each takes its share.
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))


def run_peer(
    rendezvous: Rendezvous,
    device_kind: str = "auto",
    local_ranks: int = 1,
    cuda: CudaRuntime = torch.cuda,
) -> ExchangeTally:
    """A peer's whole life: claim its device (`claim_device`), join, receive rank 0's recipe,
    build this rank's executor, then run every plan rank 0 sends until it sends None; returns
    what this rank exchanged. Raises ParallelFailure when the group breaks."""
    device = claim_device(device_kind, rendezvous.local_rank, cuda)
    _share_cores(local_ranks, device)
    group = RankGroup(rendezvous, device)
    try:
        recipe = group.receive()
        if not isinstance(recipe, ExecutorRecipe):
            raise TypeError(f"rank 0 sent {type(recipe).__name__}, not an executor recipe")
        executor = recipe.build(group.collectives, rendezvous.local_rank)
        while (plan := group.receive()) is not None:
            executor.submit(plan)  # type: ignore[arg-type]
        return group.collectives.tally
    finally:
        group.close()


def _spawn_peer(rendezvous: Rendezvous, device_kind: str, local_ranks: int) -> subprocess.Popen:
    """Starts `helios tp-worker` as a fresh interpreter (spawn semantics, never a fork) with the
    variables torchrun would give it; it inherits this process's output streams."""
    command = [
        sys.executable,
        "-m",
        "adapters.cli.main",
        "tp-worker",
        "--device",
        device_kind,
        "--local-ranks",
        str(local_ranks),
    ]
    environment = {**os.environ, **rendezvous.environment()}
    # The peer imports the very code this process runs, wherever the interpreter would look.
    source_root = str(Path(adapters.__file__).resolve().parent.parent)
    search_path = [source_root, *filter(None, [environment.get("PYTHONPATH")])]
    environment["PYTHONPATH"] = os.pathsep.join(search_path)
    return subprocess.Popen(command, env=environment)


@dataclass(frozen=True, slots=True)
class ParallelLaunch:
    """How rank 0 starts its world: ranks 0..local_ranks-1 on this machine (None: all of them)
    and how long an exchange waits for a peer."""

    local_ranks: int | None = None
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.local_ranks is not None and self.local_ranks < 1:
            raise ValueError(f"local ranks must be positive, got {self.local_ranks}")
        if not self.timeout_s > 0:
            raise ValueError(f"the collective timeout must be positive, got {self.timeout_s}")

    def rendezvous(
        self, world_size: int, environment: Mapping[str, str] = os.environ
    ) -> Rendezvous:
        """Rank 0's place: at MASTER_ADDR:MASTER_PORT when set (ranks on other machines), else
        a free loopback port."""
        if "MASTER_ADDR" in environment or "MASTER_PORT" in environment:
            found = Rendezvous.from_environment(
                environment, world_size=world_size, rank=0, local_rank=0, timeout_s=self.timeout_s
            )
            # Rank 0 is the serving process whatever RANK says; the world is the flag's.
            return Rendezvous(
                found.master_addr, found.master_port, world_size, 0, 0, self.timeout_s
            )
        return Rendezvous("127.0.0.1", free_port(), world_size, 0, 0, self.timeout_s)


@dataclass
class World:
    """Rank 0's handle on a started world: its executor and the peers it spawned."""

    executor: CoordinatorExecutor
    peers: Sequence[subprocess.Popen] = ()
    # This process's CPU threads before the world took its share of the cores.
    threads: int = 0

    def close(self, timeout: float = 10.0) -> None:
        self.executor.close()
        for peer in self.peers:
            try:
                peer.wait(timeout)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()
        if self.threads:
            torch.set_num_threads(self.threads)


def start_world(
    recipe: ExecutorRecipe,
    launch: ParallelLaunch | None = None,
    *,
    environment: Mapping[str, str] = os.environ,
    on_failure: Callable[[str], None] = lambda message: None,
    grammars: LlguidanceCompiler | None = None,
) -> World:
    """Rank 0: starts ranks 1..local_ranks-1 on this machine (`_spawn_peer`), waits for
    every rank of the world (the others start with `helios tp-worker`), sends the recipe and
    builds its own executor (with `grammars`, the compiler the engine checks requests with).
    """
    launch = launch or ParallelLaunch()
    world_size = recipe.settings.tensor_parallel_size
    rendezvous = launch.rendezvous(world_size, environment)
    local = world_size if launch.local_ranks is None else launch.local_ranks
    if not 1 <= local <= world_size:
        raise ValueError(f"local ranks must be in 1..{world_size}, got {local}")
    device = claim_device(recipe.settings.device, 0)
    peers = [
        _spawn_peer(rendezvous.for_rank(rank, rank), recipe.settings.device, local)
        for rank in range(1, local)
    ]
    threads = torch.get_num_threads()
    try:
        _share_cores(local, device)
        group = RankGroup(rendezvous, device)
        group.send(recipe)
        executor = recipe.build(group.collectives, 0, grammars)
    except BaseException:
        for peer in peers:
            peer.kill()
            peer.wait()
        torch.set_num_threads(threads)
        raise

    def broken(message: str) -> None:
        # A broken world never recovers, and a peer that hangs would outlive this process (the
        # server leaves with os._exit), keeping its memory and device from the fresh world.
        for peer in peers:
            peer.kill()
        on_failure(message)

    return World(CoordinatorExecutor(executor, group, broken), peers, threads)
