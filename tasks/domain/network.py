"""The network: the tutorial's ResNet18 with a 1-channel ``conv1``, its input transform and weight loading.

Runs on the workers (training) and the driver (evaluation, registration).

Example::

    model = load_model(checkpoint_folder, build=build_model)
    logits = model(to_inputs(images_uint8))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a network is built or fed: the recipe's names need no torch
    import torch

# FashionMNIST's pixel mean and standard deviation, as in the tutorial's Normalize.
MEAN, STD = 0.28604, 0.32025
MODEL_FILE = "model.pt"  # the state dict in every checkpoint the training loop writes
NUM_CLASSES = 10


# The tutorial's network (torchvision's resnet18, 1-channel conv1); the registered model's network file names the
# same (classifier_network.ARCHITECTURE; a test checks they agree).
TUTORIAL_ARCHITECTURE = "resnet18-1ch"


def build_model(
    architecture: str = TUTORIAL_ARCHITECTURE, num_classes: int = NUM_CLASSES, in_channels: int = 1
) -> torch.nn.Module:
    """The untrained network for ``num_classes`` classes with an ``in_channels`` ``conv1`` (1: grayscale).

    ``resnet18-1ch``: the tutorial's, torchvision's ``resnet18`` (7x7 stride-2 ``conv1``, then max-pooling:
    the first block sees 7x7). Any other architecture (``resnet18-1ch-small``: 3x3 stride-1 ``conv1``, half
    the widths) is the registered model's network class, which defines them
    (``classifier_network.ARCHITECTURES``; torch only: training's workers do not import mlflow).
    """
    if architecture != TUTORIAL_ARCHITECTURE:
        from tasks.domain.classifier_network import build_network

        return build_network(num_classes, architecture, in_channels)
    import torch
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = torch.nn.Conv2d(in_channels, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def to_inputs(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, H, W]`` (gray) or ``[N, C, H, W]`` images -> normalised float ``[N, C, H, W]`` (ToTensor + Normalize)."""
    import torch

    inputs = (images.to(torch.float32) / 255.0 - MEAN) / STD
    return inputs.unsqueeze(1) if inputs.dim() == 3 else inputs


def load_model(checkpoint_dir: str, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model saved in a checkpoint folder by the training loop, in eval mode (tutorial step [6]).

    ``build`` makes the untrained network: :func:`build_model` (torchvision's) or the registered
    model's torch-only copy (``classifier_network.build_network``), which loads without importing torchvision.
    """
    import torch

    state = torch.load(os.path.join(checkpoint_dir, MODEL_FILE), map_location="cpu", weights_only=True)
    with torch.device("meta"):  # no random initialisation that the weights replace at once
        model = build()
    model.load_state_dict(state, assign=True)
    return model.eval()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside a DistributedDataParallel wrapper (or ``model`` itself)."""
    return model.module if hasattr(model, "module") else model
