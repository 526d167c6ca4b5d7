"""The Ray actor behind ``trainlib.collective``: one per attempt, created by the first rank that needs it. Runs as
an actor; called from worker actors.

Every rank numbers its collective calls (the session's counter), so a call is matched with the other ranks' call of
the same number, never with an earlier or later one. The actor is named after the run and the attempt: a restarted
group gets a new one, and the actor ends with the worker that created it (the group's teardown).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any


@dataclasses.dataclass
class _Round:
    world_size: int
    caller: str
    done: asyncio.Event
    arrived: set[int] = dataclasses.field(default_factory=set)
    left: int = 0
    data: Any = None


class Rendezvous:
    """Releases the ranks of one collective call once all ``world_size`` have arrived; returns rank 0's data."""

    def __init__(self) -> None:
        self._rounds: dict[int, _Round] = {}

    async def join(self, seq: int, rank: int, world_size: int, data: Any, caller: str) -> Any:
        entry = self._rounds.get(seq)
        if entry is None:
            entry = self._rounds[seq] = _Round(world_size, caller, asyncio.Event())
        if world_size != entry.world_size:
            raise ValueError(
                f"Expected all callers to provide the same world size. Got {world_size} and expected "
                f"{entry.world_size}."
            )
        if rank == 0:
            entry.data = data
        entry.arrived.add(rank)
        if len(entry.arrived) == entry.world_size:
            entry.done.set()
        await entry.done.wait()
        entry.left += 1
        if entry.left == entry.world_size:
            del self._rounds[seq]
        return entry.data

    def missing_ranks(self, seq: int) -> list[int]:
        """The ranks not yet in call ``seq`` (empty once it released)."""
        entry = self._rounds.get(seq)
        if entry is None or entry.done.is_set():
            return []
        return sorted(set(range(entry.world_size)) - entry.arrived)


def actor_name(run_uri: str, attempt: int) -> str:
    """The actor's name: the same on every rank of one attempt of one run, different for any other."""
    return "trainlib-collective-" + hashlib.sha256(f"{run_uri}\n{attempt}".encode()).hexdigest()[:32]


def get_or_create(run_uri: str, attempt: int) -> Any:
    """This attempt's actor handle (created, taking no CPU, by the first rank that asks)."""
    import ray

    remote = ray.remote(num_cpus=0, max_concurrency=1000)(Rendezvous)
    return remote.options(name=actor_name(run_uri, attempt), get_if_exists=True).remote()
