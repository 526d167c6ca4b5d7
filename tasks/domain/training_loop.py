"""The training loop every trainlib worker runs: ``train_func``. Runs in trainlib's worker actors.

The Ray Train tutorial's loop (ResNet18 with a 1-channel ``conv1``, cross-entropy, a per-worker
batch size; optimizer, schedule, regularisation and augmentation from a
:class:`tasks.domain.recipe.Recipe`, the tutorial's Adam by ``recipe="tutorial"``) with three changes: it reads the data set the pipeline staged to run
storage (or its shard of the run's snapshot of the user's images) instead of downloading it, it holds out a validation slice to report
``val_accuracy`` each epoch, and it resumes from ``get_checkpoint()`` after a restart or when
the run is continued. Imports no Prefect, so workers stay light.

Example::

    trainer = TorchTrainer(train_func, train_loop_config=training_config(settings, staged),
                           scaling_config=trainlib.ScalingConfig(num_workers=2))
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch.nn import CrossEntropyLoss
from torch.utils.data import DataLoader, TensorDataset

import trainlib
from tasks.domain.data_source import open_fs
from tasks.domain.dataset_fetch import fetch_dataset
from tasks.domain.idx_files import load_fashion_mnist_split
from tasks.domain.image_spec import ImageSpec
from tasks.domain.network import MEAN, MODEL_FILE, STD, build_model, to_inputs, unwrap
from tasks.domain.progress import ProgressMeter, ProgressSink
from tasks.domain.recipe import Recipe, augment_batch, make_optimizer, make_scheduler
from tasks.domain.snapshot import read_snapshot
from tasks.domain.snapshot_files import SnapshotReader
from tasks.domain.snapshot_loading import load_shard
from trainlib.torch import get_device, prepare_data_loader, prepare_model

STATE_FILE = "train_state.pt"  # optimizer state and the epoch, beside the model in each checkpoint


def split_train_val(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic train/validation indices of ``n`` training images (every rank gets the same)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r} must be between 0 and 1 (exclusive), e.g. 0.1.")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    if n - n_val < 1:
        raise ValueError(
            f"{n} training image(s) leave none to train on after a {val_fraction:.0%} validation split: raise limit."
        )
    return order[n_val:], order[:n_val]


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_backend() == "nccl":
            tensor = tensor.to(get_device())
        torch.distributed.all_reduce(tensor)
    return tensor.cpu().tolist()


def _idx_data(config: dict[str, Any], rank: int, world_size: int) -> tuple[DataLoader, DataLoader, int]:
    """A built-in idx set, staged to run storage: every rank loads it whole, the sampler shards it."""
    files = fetch_dataset(
        config["dataset"], config["node_cache_dir"], mirrors=[config["staged_url"]], md5s=config["md5s"]
    )
    images, labels = load_fashion_mnist_split(files.folder, train=True, limit=config.get("limit"))
    train_idx, val_idx = split_train_val(len(labels), config["val_fraction"], config["seed"])
    inputs = to_inputs(images)
    train_loader = prepare_data_loader(
        DataLoader(TensorDataset(inputs[train_idx], labels[train_idx]), batch_size=config["batch_size"], shuffle=True)
    )
    # Each rank scores its own slice of the validation set exactly once; the counts are summed.
    mine = val_idx[rank::world_size]
    val_loader = DataLoader(TensorDataset(inputs[mine], labels[mine]), batch_size=config["batch_size"])
    return train_loader, val_loader, len(mine)


def _snapshot_data(
    config: dict[str, Any], spec: ImageSpec, rank: int, world_size: int
) -> tuple[DataLoader, DataLoader, int]:
    """A snapshot: each rank decodes only its shard (equal lengths, so equal steps); no sampler needed."""
    snapshot = read_snapshot(config["snapshot_uri"])
    reader = SnapshotReader(snapshot, config["node_cache_dir"])
    shard = load_shard(reader, spec, rank, world_size, config["val_fraction"], config["seed"], config.get("limit"))
    train_loader = prepare_data_loader(
        DataLoader(
            TensorDataset(to_inputs(shard.train_images), shard.train_labels),
            batch_size=config["batch_size"],
            shuffle=True,
        ),
        add_dist_sampler=False,
    )
    val_loader = DataLoader(
        TensorDataset(to_inputs(shard.val_images), shard.val_labels), batch_size=config["batch_size"]
    )
    return train_loader, val_loader, len(shard.val_labels)


def load_initial_weights(model: torch.nn.Module, weights_uri: str) -> None:
    """Load a warm start's state dict at ``weights_uri`` (:mod:`tasks.domain.warm_start`) into ``model``."""
    fs, path = open_fs(weights_uri)
    with fs.open(path, "rb") as handle:
        model.load_state_dict(torch.load(handle, map_location="cpu", weights_only=True))


def train_func(config: dict[str, Any], progress: ProgressSink | None = None) -> None:
    """The training loop every worker runs. Reports loss and validation accuracy once per epoch.

    Config keys (built by ``tasks.domain.training_run.training_config``): ``dataset``,
    ``staged_url``, ``md5s`` (the staged copy and its checksums), ``node_cache_dir`` (where this
    node keeps its verified copy), ``limit`` (training images to use, None for all),
    ``val_fraction``, ``recipe`` (a :class:`Recipe` as a plain dict), ``batch_size`` (per worker),
    ``epochs``, ``seed``; for a user's data instead of an idx set: ``snapshot_uri`` (the run's
    snapshot) and ``image_spec`` (an :class:`ImageSpec` record: classes, channels, size).

    ``progress``: where rank 0 tells its progress within the epoch (bound with
    ``functools.partial``; it is a channel, not a hyperparameter, so it stays out of the config
    that trainlib records and MLflow logs as params).
    """
    context = trainlib.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(config["seed"])

    # Model, loss, optimizer (the recipe's); a snapshot's ImageSpec sets the classes and input channels.
    recipe = Recipe(**config["recipe"])
    spec = ImageSpec.from_record(config["image_spec"]) if config.get("image_spec") else None
    shape = (spec.num_classes, spec.channels) if spec else ()
    model = prepare_model(build_model(recipe.architecture, *shape))
    criterion = CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    val_criterion = CrossEntropyLoss()  # validation loss stays comparable across recipes
    optimizer = make_optimizer(recipe, model.parameters())

    if spec is None:
        train_loader, val_loader, val_count = _idx_data(config, rank, world_size)
    else:
        train_loader, val_loader, val_count = _snapshot_data(config, spec, rank, world_size)
    scheduler = make_scheduler(recipe, optimizer, len(train_loader), config["epochs"])
    background = -MEAN / STD  # a black pixel, normalised: the padding of random crops

    start_epoch = 0
    checkpoint = trainlib.get_checkpoint()
    if config.get("init_weights_uri") and not checkpoint:  # a warm start; a resumed run has its own weights
        load_initial_weights(unwrap(model), config["init_weights_uri"])
    if checkpoint:
        with checkpoint.as_directory() as folder:
            unwrap(model).load_state_dict(torch.load(os.path.join(folder, MODEL_FILE), weights_only=True))
            state = torch.load(os.path.join(folder, STATE_FILE), weights_only=True)
            optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None and state.get("scheduler"):
                scheduler.load_state_dict(state["scheduler"])
            start_epoch = state["epoch"] + 1

    device = get_device()
    meter = None
    if rank == 0 and progress is not None:
        meter = ProgressMeter(progress, config["epochs"], len(train_loader), world_size)
    first_step_loss = None  # this attempt's first training loss: a warm start's is the parent's, not ~ln(classes)
    for epoch in range(start_epoch, config["epochs"]):
        if world_size > 1 and hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        if meter:
            meter.start_epoch(epoch)
        model.train()
        loss_sum, seen = 0.0, 0
        for batch_images, batch_labels in train_loader:
            outputs = model(augment_batch(batch_images, recipe, background))
            loss = criterion(outputs, batch_labels)
            if first_step_loss is None:
                first_step_loss = loss.item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            loss_sum += loss.item() * len(batch_labels)
            seen += len(batch_labels)
            if meter:
                meter.step(len(batch_labels))

        model.eval()
        val_correct = val_loss = 0.0
        with torch.no_grad():
            for batch_images, batch_labels in val_loader:
                batch_images, batch_labels = batch_images.to(device), batch_labels.to(device)
                outputs = unwrap(model)(batch_images)
                val_loss += val_criterion(outputs, batch_labels).item() * len(batch_labels)
                val_correct += (outputs.argmax(1) == batch_labels).sum().item()
        loss_sum, seen, val_loss, val_correct, val_seen = _all_reduce_sum(
            [loss_sum, seen, val_loss, val_correct, val_count]
        )

        metrics = {
            "epoch": epoch,
            "loss": loss_sum / max(seen, 1),
            "val_loss": val_loss / max(val_seen, 1),
            "val_accuracy": val_correct / max(val_seen, 1),
            "first_step_loss": first_step_loss,
        }
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save(unwrap(model).state_dict(), os.path.join(folder, MODEL_FILE))
                torch.save(
                    {
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch,
                        "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    },
                    os.path.join(folder, STATE_FILE),
                )
            trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
