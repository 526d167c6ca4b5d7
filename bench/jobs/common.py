"""The benchmark's training job, shared by every variant. Runs in the job's training processes.

The job is the tutorial's (examples/tutorial.py): ResNet18 with a 1-channel conv1,
FashionMNIST normalised as there, Adam(lr=1e-3), CrossEntropyLoss, batches of 128
per worker, shuffled. It stops after a fixed number of steps instead of 10 epochs,
and rank 0 writes wall-clock timestamps (``time.time()``) to a JSON file for the
parent (bench/bench_overhead.py) to read.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torchvision.datasets import FashionMNIST
from torchvision.models import resnet18
from torchvision.transforms import Compose, Normalize, ToTensor

BATCH_SIZE = 128
LEARNING_RATE = 1e-3


def build_model() -> torch.nn.Module:
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def build_dataset(data_root: str) -> FashionMNIST:
    """The training split, from files the parent placed with tasks.domain.torchvision_layout."""
    transform = Compose([ToTensor(), Normalize((0.28604,), (0.32025,))])
    return FashionMNIST(root=data_root, train=True, download=False, transform=transform)


def train_steps(
    model: torch.nn.Module, loader: Any, steps: int, set_epoch: Callable[[int], None] | None
) -> dict[str, Any]:
    """Train for ``steps`` optimizer steps (across epochs if needed); return the timestamps."""
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
    first_step_start = None
    step_ends: list[float] = []
    loss = None
    epoch = 0
    while len(step_ends) < steps:
        if set_epoch is not None:
            set_epoch(epoch)
        for images, labels in loader:
            if first_step_start is None:
                first_step_start = time.time()
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step_ends.append(time.time())
            if len(step_ends) >= steps:
                break
        epoch += 1
    return {
        "first_step_start": first_step_start,
        "step_ends": step_ends,
        "final_loss": float(loss.item()) if loss is not None else None,
    }


def thread_info() -> dict[str, Any]:
    """What this process trains with: torch's intra-op threads and the thread variables."""
    return {
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "pid": os.getpid(),
    }


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write atomically, so the parent never reads half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def parse_job_args() -> argparse.Namespace:
    """The options every job variant takes: steps, where the data is, where to store, where to write."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args()
