"""Where tensor-parallel ranks meet (torchrun's variables) and the two groups they share."""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from adapters.gpu.distributed.collectives import Collectives, ParallelFailure

# A peer waits for the next plan for as long as the server idles, so the control group, which
# carries only plans, never times out while a peer waits for one; rank 0's sends and the
# exchanges inside a step do (`timeout_s`): gloo's send waits until the receiver takes the
# message, so an unbounded send would hang rank 0 forever on a peer that hangs.
_CONTROL_TIMEOUT = timedelta(days=3650)
DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """One rank's place in a world, as torchrun spells it: MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
    RANK, LOCAL_RANK; rank 0 (the serving process) listens at the master address."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int
    local_rank: int
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"MASTER_PORT must be a TCP port, got {self.master_port}")
        if self.local_rank < 0 or not self.timeout_s > 0:
            raise ValueError("LOCAL_RANK must be >= 0 and the collective timeout positive")

    @classmethod
    def from_environment(
        cls, environment: Mapping[str, str] = os.environ, **defaults: Any
    ) -> Rendezvous:
        """Reads torchrun's variables; `defaults` fill those that are not set."""
        values: dict[str, Any] = dict(defaults)
        names = {
            "MASTER_ADDR": ("master_addr", str),
            "MASTER_PORT": ("master_port", int),
            "WORLD_SIZE": ("world_size", int),
            "RANK": ("rank", int),
            "LOCAL_RANK": ("local_rank", int),
            "HELIOS_TP_TIMEOUT": ("timeout_s", float),
        }
        for variable, (field_name, kind) in names.items():
            if variable in environment:
                try:
                    values[field_name] = kind(environment[variable])
                except ValueError:
                    raise ValueError(f"{variable}={environment[variable]!r} is malformed") from None
        # LOCAL_RANK defaults to RANK (one rank per machine) and the timeout to its default.
        values.setdefault("local_rank", values.get("rank", 0))
        optional = ("LOCAL_RANK", "HELIOS_TP_TIMEOUT")
        missing = [v for v, (f, _) in names.items() if f not in values and v not in optional]
        if missing:
            raise ValueError("the rendezvous needs " + ", ".join(missing))
        return cls(**values)

    def for_rank(self, rank: int, local_rank: int) -> Rendezvous:
        return Rendezvous(
            self.master_addr, self.master_port, self.world_size, rank, local_rank, self.timeout_s
        )

    def environment(self) -> dict[str, str]:
        """The variables that make another process this rank (what torchrun would set)."""
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "HELIOS_TP_TIMEOUT": repr(self.timeout_s),
        }


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for a world whose ranks all live on this machine)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class RankGroup:
    """This process's rank: the data group whose exchanges time out, and the control group
    that carries plans from rank 0."""

    def __init__(self, rendezvous: Rendezvous, device: torch.device) -> None:
        self.rendezvous = rendezvous
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{rendezvous.master_addr}:{rendezvous.master_port}",
            rank=rendezvous.rank,
            world_size=rendezvous.world_size,
            timeout=timedelta(seconds=rendezvous.timeout_s),
        )
        self._control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
        self.collectives = Collectives()

    @property
    def rank(self) -> int:
        return self.rendezvous.rank

    def send(self, message: object) -> None:
        """Rank 0: delivers `message` (a plan, a recipe, or None to stop) to every peer."""
        self._broadcast(message)

    def receive(self) -> object:
        """A peer: waits for rank 0's next message."""
        return self._broadcast(None)

    def _broadcast(self, message: object) -> object:
        """Rank 0's `message` on every rank: its pickled length, then its bytes. Only a peer's
        wait for the length is unbounded (an idle server sends nothing); every other transfer
        fails after `timeout_s`, so a hung peer fails rank 0's next step instead of hanging it.
        """
        if self.collectives.failure is not None:
            raise ParallelFailure(self.collectives.failure)
        try:
            if self.rank == 0:
                payload = pickle.dumps(message)
                self._control_broadcast(torch.tensor([len(payload)], dtype=torch.int64))
                self._control_broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
                return message
            length = torch.zeros(1, dtype=torch.int64)
            self._control_broadcast(length, bounded=False)
            payload_tensor = torch.empty(int(length.item()), dtype=torch.uint8)
            self._control_broadcast(payload_tensor)
            return pickle.loads(payload_tensor.numpy().tobytes())
        except Exception as error:  # noqa: BLE001 - any backend error breaks the whole group
            self.collectives.failure = (
                f"tensor-parallel rank {self.rank} lost the control group: a rank died, hung "
                f"past the collective timeout or left ({error})"
            )
            raise ParallelFailure(self.collectives.failure) from error

    def _control_broadcast(self, tensor: torch.Tensor, bounded: bool = True) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        if bounded:
            options.timeout = timedelta(seconds=self.rendezvous.timeout_s)
        self._control.broadcast([tensor], options).wait()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
