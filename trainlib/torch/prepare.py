"""``prepare_model``, ``prepare_data_loader``, ``get_device``. Runs in worker actors only.

Called from inside ``train_loop_per_worker``; they read the worker's session.
Outside a worker (world size 1, no session) they are harmless no-ops on the
CPU, so a script can be tried without Ray.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from trainlib._internal.execution.session import current_session


def _world() -> tuple[int, int]:
    s = current_session()
    if s is None:
        return 0, 1
    return s.info.world_rank, s.info.world_size


def get_device() -> torch.device:
    """The device this worker trains on: its GPU with ``use_gpu=True``, else the CPU."""
    s = current_session()
    if s is not None and s.device is not None:
        return s.device
    return torch.device("cpu")


def prepare_model(model: torch.nn.Module, move_to_device: bool = True, parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it in DistributedDataParallel when world size > 1.

    Args:
        model: the model, as built by the training function.
        move_to_device: move parameters and buffers to :func:`get_device`.
        parallel_strategy: ``"ddp"``, or None to skip wrapping.
        parallel_strategy_kwargs: extra keyword arguments for DistributedDataParallel.
            trainlib sets ``gradient_as_bucket_view=True`` unless given here: the gradients
            live in DDP's allreduce buckets instead of beside them, one copy less per step and
            one gradient-sized buffer less per worker (bench/results/ddp.md). Pass False if
            your code calls ``detach_()`` on gradients.

    Returns:
        The model, wrapped in DDP when training with more than one worker (use
        ``model.module`` to reach the plain model, e.g. to save its state_dict).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model() takes a torch.nn.Module, got {type(model).__name__}.")
    if parallel_strategy not in ("ddp", None):
        raise ValueError(f"prepare_model(parallel_strategy={parallel_strategy!r}) is invalid: use 'ddp' or None.")
    device = get_device()
    if move_to_device:
        model = model.to(device)
    _, world_size = _world()
    if world_size > 1 and parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        kwargs = dict(parallel_strategy_kwargs or {})
        kwargs.setdefault("gradient_as_bucket_view", True)
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        model = DistributedDataParallel(model, **kwargs)
    return model


class _DeviceDataLoader:
    """Iterates a DataLoader and moves every batch to the device (GPU workers only)."""

    def __init__(self, loader: DataLoader, device: torch.device):
        self._loader = loader
        self._device = device

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield _to_device(batch, self._device)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # sampler, dataset, batch_size...
        return getattr(self._loader, name)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(b, device) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True) -> DataLoader:
    """Shard ``data_loader`` across workers and move its batches to this worker's device.

    With world size > 1, the loader is rebuilt with a ``DistributedSampler``
    that keeps the loader's shuffle setting (call ``loader.sampler.set_epoch(epoch)``
    each epoch to reshuffle). A ``DistributedSampler`` the user set already is
    kept as it is. On a GPU, batches are moved to the device as they are read.

    Args:
        data_loader: a map-style ``torch.utils.data.DataLoader``.
        add_dist_sampler: shard with a DistributedSampler when world size > 1.
        move_to_device: move batches to :func:`get_device` (only GPUs need it).
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"prepare_data_loader() takes a torch.utils.data.DataLoader, got {type(data_loader).__name__}.")
    rank, world_size = _world()
    loader = data_loader
    if (world_size > 1 and add_dist_sampler and not isinstance(loader.sampler, DistributedSampler)
            and not isinstance(loader.dataset, IterableDataset)):
        if loader.batch_sampler is not None and type(loader.batch_sampler).__name__ != "BatchSampler":
            raise ValueError(
                "prepare_data_loader(): the DataLoader has a custom batch_sampler, which cannot be sharded "
                "automatically: shard it yourself and pass add_dist_sampler=False."
            )
        if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            raise ValueError(
                f"prepare_data_loader(): the DataLoader uses a custom sampler ({type(loader.sampler).__name__}) "
                "that cannot be sharded automatically: use a DistributedSampler yourself, or pass "
                "add_dist_sampler=False."
            )
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle)
        loader = DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
            prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
            persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
        )
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceDataLoader(loader, device)  # type: ignore[return-value]
    return loader
