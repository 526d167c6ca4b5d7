"""What the driver tells a worker about its place in the group. Built on the driver, read in workers."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """Where one worker sits in the group; built by the driver, read by the worker."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    run_path: str
    attempt: int
