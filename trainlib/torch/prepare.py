"""``prepare_model`` and ``prepare_data_loader``. Runs in worker actors only.

Called from inside ``train_loop_per_worker``; they read the worker's session.
Outside a worker (world size 1, no session) they are harmless no-ops on the
CPU, so a script can be tried without Ray.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from trainlib._internal.execution.session import current_session
from trainlib.torch import amp, reproducibility
from trainlib.torch.devices import get_device
from trainlib.torch.fsdp import shard_model


def _world() -> tuple[int, int]:
    s = current_session()
    if s is None:
        return 0, 1
    return s.info.world_rank, s.info.world_size


_STRATEGIES = ("ddp", "fsdp", None)


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it for data-parallel training when world size > 1.

    Args:
        model: the model, as built by the training function.
        move_to_device: move parameters and buffers to :func:`get_device` (True),
            to the given ``torch.device``, or leave them where they are (False).
        parallel_strategy: ``"ddp"`` (DistributedDataParallel), ``"fsdp"`` (fully
            sharded: PyTorch's ``fully_shard``, on CPUs and GPUs, see
            ``trainlib.torch.fsdp``), or None to skip wrapping.
        parallel_strategy_kwargs: keyword arguments for DistributedDataParallel,
            or for ``fully_shard`` (``FullyShardedDataParallel`` when they are FSDP1's).
            For DDP trainlib sets ``gradient_as_bucket_view=True`` unless given here: the
            gradients live in DDP's allreduce buckets instead of beside them, one copy less per
            step and one gradient-sized buffer less per worker (docs/benchmarks.md, "Steady state (kept)"). Pass
            False if your code calls ``detach_()`` on gradients.

    Returns:
        The model, wrapped in DDP when training with more than one worker (use
        ``model.module`` to reach the plain model, e.g. to save its state_dict);
        with ``"fsdp"``, the same model object with sharded (DTensor) parameters.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model() takes a torch.nn.Module, got {type(model).__name__}.")
    if parallel_strategy not in _STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is invalid: use 'ddp', 'fsdp' or None."
        )
    if parallel_strategy_kwargs is not None and not isinstance(parallel_strategy_kwargs, dict):
        raise TypeError("prepare_model(parallel_strategy_kwargs=...) must be a dict of keyword arguments.")
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if move_to_device is not False:
        model = model.to(device)
    model = amp.autocast_forward(model, device)
    _, world_size = _world()
    kwargs = dict(parallel_strategy_kwargs or {})
    if world_size > 1 and parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        kwargs.setdefault("gradient_as_bucket_view", True)
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        model = DistributedDataParallel(model, **kwargs)
    elif world_size > 1 and parallel_strategy == "fsdp":
        model = shard_model(model, device, kwargs)
    return model


class _DeviceDataLoader:
    """Iterates a DataLoader and moves every batch to the device (GPU workers only).

    With ``auto_transfer`` the next batch is copied on a side CUDA stream while
    the current one trains (as Ray Train's), so the copy overlaps the compute.
    """

    def __init__(self, loader: DataLoader, device: torch.device, auto_transfer: bool = False):
        self._loader = loader
        self._device = device
        self._stream = torch.cuda.Stream(device) if auto_transfer and device.type == "cuda" else None

    def __iter__(self) -> Iterator[Any]:
        if self._stream is None:
            for batch in self._loader:
                yield _to_device(batch, self._device)
            return
        batches = iter(self._loader)
        upcoming = self._prefetch(batches)
        while upcoming is not None:
            batch = upcoming
            torch.cuda.current_stream(self._device).wait_stream(self._stream)
            _record_stream(batch, torch.cuda.current_stream(self._device))
            upcoming = self._prefetch(batches)
            yield batch

    def _prefetch(self, batches: Iterator[Any]) -> Any:
        try:
            batch = next(batches)
        except StopIteration:
            return None
        with torch.cuda.stream(self._stream):
            return _to_device(batch, self._device)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:  # sampler, dataset, batch_size...
        return getattr(self._loader, name)


def _record_stream(batch: Any, stream: Any) -> None:
    """Tell the allocator that ``stream`` uses the batch's tensors (they were made on the copy stream)."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _record_stream(item, stream)
    elif isinstance(batch, dict):
        for item in batch.values():
            _record_stream(item, stream)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(b, device) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def prepare_data_loader(
    data_loader: DataLoader, add_dist_sampler: bool = True, move_to_device: bool = True, auto_transfer: bool = True
) -> DataLoader:
    """Shard ``data_loader`` across workers and move its batches to this worker's device.

    With world size > 1, the loader is rebuilt with a ``DistributedSampler``
    that keeps the loader's shuffle setting (call ``loader.sampler.set_epoch(epoch)``
    each epoch to reshuffle). A ``DistributedSampler`` the user set already is
    kept as it is. On a GPU, batches are moved to the device as they are read.

    Args:
        data_loader: a map-style ``torch.utils.data.DataLoader``.
        add_dist_sampler: shard with a DistributedSampler when world size > 1.
        move_to_device: move batches to :func:`get_device` (only GPUs need it).
        auto_transfer: on a GPU, copy the next batch to the device on a side CUDA
            stream while the current one trains. Ignored on the CPU and when
            ``move_to_device`` is False.

    After :func:`~trainlib.torch.enable_reproducibility`, the sharded loader's
    shuffling and its loader worker processes are seeded from that seed.
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"prepare_data_loader() takes a torch.utils.data.DataLoader, got {type(data_loader).__name__}.")
    rank, world_size = _world()
    loader = data_loader
    if (
        world_size > 1
        and add_dist_sampler
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
    ):
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
        seed = reproducibility.seed()
        sampler = DistributedSampler(
            loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed or 0
        )
        worker_init_fn, generator = loader.worker_init_fn, loader.generator
        if seed is not None:
            worker_init_fn = functools.partial(_seeded_worker_init, loader.worker_init_fn)
            generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=generator,
            prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
            persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
        )
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceDataLoader(loader, device, auto_transfer)  # type: ignore[return-value]
    return loader


def _seeded_worker_init(user_init: Any, worker_id: int) -> None:
    reproducibility.seed_loader_worker(worker_id)
    if user_init is not None:
        user_init(worker_id)
