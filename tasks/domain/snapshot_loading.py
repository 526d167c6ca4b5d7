"""A worker's images from a snapshot: its shard of the training split, decoded and resized. Runs on workers.

Each rank reads only its shard (``train[rank::world_size]``, padded to equal length so every rank
takes the same number of steps) and its slice of the validation split; files come from the
source (local) or the node's blob cache (remote, fetched once per node) and are checked against
their hashes, then decoded with torchvision's decoders to the run's :class:`ImageSpec` into one
uint8 tensor, so the epochs read memory, not files. The evaluate step reads the test split the same way.

Example::

    shard = load_shard(snapshot, spec, "/local/cache", rank=0, world_size=2, val_fraction=0.1, seed=0)
    shard.train_images.shape  # [N, C, H, W] uint8
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from tasks.domain.image_decode import decode_to_spec
from tasks.domain.image_spec import ImageSpec
from tasks.domain.snapshot import Snapshot, SnapshotEntry
from tasks.domain.snapshot_files import SnapshotReader

DECODE_BATCH = 512  # files read and decoded per round: bounds the encoded bytes held at once


@dataclasses.dataclass(frozen=True)
class Shard:
    """One rank's images: uint8 ``[N, C, H, W]`` and int64 labels, for training and validation."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor


def training_entries(snapshot: Snapshot, limit: int | None) -> list[SnapshotEntry]:
    """The training split in a fixed order (by path), cut to ``limit``: every rank sees the same list."""
    entries = sorted(snapshot.split("train"), key=lambda e: e.path)
    return entries[:limit] if limit else entries


def decode_entries(
    reader: SnapshotReader, entries: Sequence[SnapshotEntry], spec: ImageSpec, threads: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[N, C, H, W]`` images of ``entries`` at ``spec`` and their labels (``spec.class_names`` order)."""
    label_of = {name: i for i, name in enumerate(spec.class_names)}
    images = torch.empty((len(entries), spec.channels, spec.height, spec.width), dtype=torch.uint8)
    labels = torch.tensor([label_of[e.label] for e in entries], dtype=torch.int64)
    threads = threads or max(1, len(os.sched_getaffinity(0)))

    def one(item: tuple[int, bytes]) -> None:
        i, data = item
        images[i] = decode_to_spec(data, spec.channels, spec.height, spec.width)

    with ThreadPoolExecutor(threads) as pool:
        for start in range(0, len(entries), DECODE_BATCH):
            chunk = entries[start : start + DECODE_BATCH]
            blobs = reader.read_many(chunk)
            list(pool.map(one, zip(range(start, start + len(chunk)), blobs, strict=True)))
    return images, labels


def shard_indices(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """``indices[rank::world_size]``, padded from the start to ``ceil(n / world_size)`` (as DistributedSampler)."""
    per_rank = -(-len(indices) // world_size)
    mine = indices[rank::world_size]
    if len(mine) < per_rank:
        mine = torch.cat([mine, indices[: per_rank - len(mine)]])
    return mine


def load_shard(
    reader: SnapshotReader,
    spec: ImageSpec,
    rank: int,
    world_size: int,
    val_fraction: float,
    seed: int,
    limit: int | None = None,
) -> Shard:
    """This rank's training shard and validation slice of ``reader``'s snapshot, decoded at ``spec``."""
    from tasks.domain.training_loop import split_train_val

    entries = training_entries(reader.snapshot, limit)
    train_idx, val_idx = split_train_val(len(entries), val_fraction, seed)
    mine_train = shard_indices(train_idx, rank, world_size)
    mine_val = val_idx[rank::world_size]
    train_images, train_labels = decode_entries(reader, [entries[i] for i in mine_train.tolist()], spec)
    val_images, val_labels = decode_entries(reader, [entries[i] for i in mine_val.tolist()], spec)
    return Shard(train_images, train_labels, val_images, val_labels)
