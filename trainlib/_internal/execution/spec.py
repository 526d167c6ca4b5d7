"""Where a worker landed, and what the driver sends it to start an attempt: its place and the attempt. Both sides.

``TrainWorker.start`` takes one :class:`WorkerStart`; the worker keeps its parts on its session.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib._internal.storage.run_storage import RunStorage
    from trainlib.checkpoint import Checkpoint


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one worker actor landed; sent by the actor (``TrainWorker.describe``) to the driver."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...] = ()  # the GPUs Ray gave this actor


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """Where one worker sits in the group and how it joins it; built by the driver, read by the worker."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    gpu_index: int | None = None  # this worker's GPU among the node's visible ones; None without GPUs


@dataclasses.dataclass(frozen=True)
class AttemptSpec:
    """One attempt of the run, the same for every rank. Built by the controller."""

    attempt: int  # 0 for the first; one more per restart and per resume of the run
    storage: RunStorage
    checkpoint: Checkpoint | None  # what ``get_checkpoint()`` returns
    first_step: int  # the step number of the attempt's first report

    @property
    def experiment_name(self) -> str:
        return self.storage.name


@dataclasses.dataclass(frozen=True)
class WorkerStart:
    """Everything one rank needs to start an attempt: the single argument of ``TrainWorker.start``."""

    attempt: AttemptSpec
    info: WorkerInfo
    env: dict[str, str]  # torchrun's variables and CUDA_VISIBLE_DEVICES, for code that reads them
    train_fn: Any  # the ``TrainFunction``, or a Ray reference to it (put once per run by the driver)
    metadata: dict[str, Any] | None = None  # the trainer's ``metadata`` (``get_context().get_metadata()``)
    dataset_shards: dict[str, Any] | None = None  # dataset name -> this rank's ``ray.data.DataIterator``
