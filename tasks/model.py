"""The tutorial's model and training function. ``train_func`` runs in trainlib's worker actors.

This module imports no Prefect, so workers stay light: it is plain PyTorch plus
``trainlib``. ``train_func`` is the Ray Train tutorial's training loop (ResNet18
with a 1-channel ``conv1``, Adam, cross-entropy, a per-worker batch size) with
three changes: it reads the data set that the pipeline staged to run storage
instead of downloading it from the internet, it holds out a validation slice to
report ``val_accuracy`` each epoch, and it resumes from ``get_checkpoint()``
after a restart.

Example::

    trainer = TorchTrainer(train_func, train_loop_config=training_config(...),
                           scaling_config=trainlib.ScalingConfig(num_workers=2))
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import trainlib
from trainlib.torch import get_device, prepare_data_loader, prepare_model

# FashionMNIST's pixel mean and standard deviation, as in the tutorial's Normalize.
MEAN, STD = 0.28604, 0.32025
MODEL_FILE = "model.pt"
STATE_FILE = "train_state.pt"

CLASS_NAMES = {
    "fashion-mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                      "Bag", "Ankle boot"),
    "mnist": tuple(str(d) for d in range(10)),
}


def build_model() -> torch.nn.Module:
    """ResNet18 for 10 classes with ``conv1`` taking one (grayscale) channel, as in the tutorial."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def to_inputs(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, 28, 28]`` images -> normalised float ``[N, 1, 28, 28]`` (ToTensor + Normalize)."""
    return ((images.to(torch.float32) / 255.0 - MEAN) / STD).unsqueeze(1)


def load_model(checkpoint_dir: str) -> torch.nn.Module:
    """The model saved in a checkpoint folder by :func:`train_func`, in eval mode (tutorial step [6])."""
    model = build_model()
    state = torch.load(os.path.join(checkpoint_dir, MODEL_FILE), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def split_train_val(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic train/validation indices of ``n`` training images (every rank gets the same)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r} must be between 0 and 1 (exclusive), e.g. 0.1.")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    if n - n_val < 1:
        raise ValueError(f"{n} training image(s) leave none to train on after a {val_fraction:.0%} "
                         "validation split: raise limit.")
    return order[n_val:], order[:n_val]


def _load_staged(config: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    # Imported here: tasks/datasets.py is plain code but only the workers need it at this point.
    from tasks.datasets import fetch_dataset, load_fashion_mnist_split

    files = fetch_dataset(config["dataset"], config["node_cache_dir"], mirrors=[config["staged_url"]],
                          md5s=config["md5s"])
    return load_fashion_mnist_split(files.folder, train=True, limit=config.get("limit"))


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_backend() == "nccl":
            tensor = tensor.to(get_device())
        torch.distributed.all_reduce(tensor)
    return tensor.cpu().tolist()


def train_func(config: dict[str, Any]) -> None:
    """The training loop every worker runs. Reports loss and validation accuracy once per epoch.

    Config keys: ``dataset``, ``staged_url``, ``md5s``, ``node_cache_dir`` (where this node
    keeps its verified copy), ``limit`` (training images to use, None for all), ``val_fraction``,
    ``lr``, ``batch_size`` (per worker), ``epochs``, ``seed``.
    """
    context = trainlib.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(config["seed"])

    # Model, loss, optimizer.
    model = prepare_model(build_model())
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=config["lr"])

    # Data: the staged copy of the data set, a validation slice held out of the training split.
    images, labels = _load_staged(config)
    train_idx, val_idx = split_train_val(len(labels), config["val_fraction"], config["seed"])
    inputs = to_inputs(images)
    train_loader = prepare_data_loader(DataLoader(
        TensorDataset(inputs[train_idx], labels[train_idx]), batch_size=config["batch_size"], shuffle=True))
    # Each rank scores its own slice of the validation set exactly once; the counts are summed.
    mine = val_idx[rank::world_size]
    val_loader = DataLoader(TensorDataset(inputs[mine], labels[mine]), batch_size=config["batch_size"])

    start_epoch = 0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            _unwrap(model).load_state_dict(torch.load(os.path.join(folder, MODEL_FILE), weights_only=True))
            state = torch.load(os.path.join(folder, STATE_FILE), weights_only=True)
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1

    device = get_device()
    for epoch in range(start_epoch, config["epochs"]):
        if world_size > 1:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        loss_sum, seen = 0.0, 0
        for batch_images, batch_labels in train_loader:
            outputs = model(batch_images)
            loss = criterion(outputs, batch_labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(batch_labels)
            seen += len(batch_labels)

        model.eval()
        val_correct = val_loss = 0.0
        with torch.no_grad():
            for batch_images, batch_labels in val_loader:
                batch_images, batch_labels = batch_images.to(device), batch_labels.to(device)
                outputs = _unwrap(model)(batch_images)
                val_loss += criterion(outputs, batch_labels).item() * len(batch_labels)
                val_correct += (outputs.argmax(1) == batch_labels).sum().item()
        loss_sum, seen, val_loss, val_correct, val_seen = _all_reduce_sum(
            [loss_sum, seen, val_loss, val_correct, len(mine)])

        metrics = {"epoch": epoch, "loss": loss_sum / max(seen, 1), "val_loss": val_loss / max(val_seen, 1),
                   "val_accuracy": val_correct / max(val_seen, 1)}
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save(_unwrap(model).state_dict(), os.path.join(folder, MODEL_FILE))
                torch.save({"optimizer": optimizer.state_dict(), "epoch": epoch}, os.path.join(folder, STATE_FILE))
            trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
        if rank == 0:
            print(metrics, flush=True)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model
