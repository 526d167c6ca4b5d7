"""Training recipes: network, optimizer, learning-rate schedule, regularisation, augmentation. Runs on the workers.

Two recipes, chosen by the pipeline's ``recipe`` parameter and recorded on every registered
version:

* ``augmented`` (the default): SGD with Nesterov momentum, a one-cycle learning rate
  (warm-up then cosine decay), weight decay 5e-4, label smoothing 0.1, and random crops (2-pixel
  padding) with horizontal flips: a standard ResNet recipe, on ``resnet18-1ch-small`` (a ResNet18 for
  28x28 images: ahead of the tutorial's network at 10 epochs on the full data, docs/benchmarks.md, "The model");
* ``tutorial``: the Ray Train tutorial's network and Adam at 1e-3, constant, no augmentation, no
  weight decay (90.21% after 10 epochs). It learns faster in very short runs (a few hundred steps), where the
  one-cycle schedule spends most of its steps warming up and cooling down.
  ``python -m bench recipe`` compares both on a subset; ``python -m bench pipeline_10ep`` is the full check.

Example::

    recipe = get_recipe("augmented")
    optimizer = make_optimizer(recipe, model.parameters())
    scheduler = make_scheduler(recipe, optimizer, steps_per_epoch=len(loader), epochs=10)
    x = augment_batch(x, recipe)  # inside the training step
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from tasks.domain.network import TUTORIAL_ARCHITECTURE

if TYPE_CHECKING:  # torch is imported where a worker trains: the flow's parameters and a skipped run need none
    import torch

RecipeName = Literal["augmented", "tutorial"]
# The recipe ahead at the length the weekly retraining runs (10 epochs, full data); in runs of a few hundred
# steps the tutorial's is ahead (docs/benchmarks.md, "The model"; docs/model.md).
DEFAULT_RECIPE: RecipeName = "augmented"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to train: every knob a recipe sets.

    Attributes:
        name: ``tutorial`` or ``augmented``.
        optimizer: ``adam`` or ``sgd`` (Nesterov momentum).
        lr: the (peak) learning rate.
        schedule: ``constant`` or ``onecycle`` (linear warm-up for ``warmup_fraction`` of the steps,
            then cosine decay to ~0).
        weight_decay: L2 penalty (decoupled for neither: plain ``weight_decay`` of the optimizer).
        momentum: SGD momentum.
        label_smoothing: of the cross-entropy loss.
        crop_padding: pixels of padding for random crops (0: no crops).
        flip: random horizontal flips.
        warmup_fraction: part of the training spent warming up (one-cycle only).
        architecture: the network trained: the tutorial's ``resnet18-1ch`` or ``resnet18-1ch-small``
            (a 3x3 stride-1 ``conv1`` for 28x28 images, half the widths; ``classifier_model.ARCHITECTURES``).
        finetune_lr_factor, finetune_epoch_fraction: the fine-tuning schedule of a run warm-started from the
            champion (:func:`fine_tuning`): this share of the learning rate, for this share of the epochs.
    """

    name: RecipeName
    optimizer: Literal["adam", "sgd"]
    lr: float
    schedule: Literal["constant", "onecycle"] = "constant"
    weight_decay: float = 0.0
    momentum: float = 0.9
    label_smoothing: float = 0.0
    crop_padding: int = 0
    flip: bool = False
    warmup_fraction: float = 0.15
    architecture: str = TUTORIAL_ARCHITECTURE
    finetune_lr_factor: float = 0.1
    finetune_epoch_fraction: float = 0.3

    def record(self) -> dict[str, Any]:
        """The recipe as plain values, for MLflow tags and descriptions."""
        return dataclasses.asdict(self)


RECIPES: dict[str, Recipe] = {
    "tutorial": Recipe(name="tutorial", optimizer="adam", lr=1e-3),
    "augmented": Recipe(
        name="augmented",
        optimizer="sgd",
        lr=0.1,
        schedule="onecycle",
        weight_decay=5e-4,
        label_smoothing=0.1,
        crop_padding=2,
        flip=True,
        architecture="resnet18-1ch-small",
    ),
}


def get_recipe(name: str, lr: float | None = None) -> Recipe:
    """The recipe called ``name``, with its learning rate replaced by ``lr`` when given.

    Raises:
        ValueError: an unknown name (the message lists the known ones) or a negative ``lr``.
    """
    if name not in RECIPES:
        raise ValueError(f"recipe={name!r} is unknown: use one of {', '.join(map(repr, RECIPES))}.")
    if lr is None:
        return RECIPES[name]
    if lr < 0:
        raise ValueError(f"lr={lr!r} must be >= 0.")
    return dataclasses.replace(RECIPES[name], lr=float(lr))


def fine_tuning(recipe: Recipe, epochs: int) -> tuple[Recipe, int]:
    """The recipe and epochs of a run that starts from trained weights: a lower learning rate, fewer epochs.

    Weights that already fit most of the data need small steps (a full one-cycle peak would undo them) and
    less time: ``finetune_lr_factor`` of the learning rate for ``finetune_epoch_fraction`` of the epochs
    (at least one).
    """
    tuned = dataclasses.replace(recipe, lr=recipe.lr * recipe.finetune_lr_factor)
    return tuned, max(1, math.ceil(epochs * recipe.finetune_epoch_fraction))


def make_optimizer(recipe: Recipe, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    if recipe.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(
        parameters,
        lr=recipe.lr,
        momentum=recipe.momentum,
        nesterov=recipe.momentum > 0,
        weight_decay=recipe.weight_decay,
    )


def make_scheduler(
    recipe: Recipe, optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A per-step scheduler (call ``step()`` after every optimizer step), or None for a constant rate."""
    import torch

    if recipe.schedule == "constant" or recipe.lr == 0:
        return None
    total = max(1, steps_per_epoch * epochs)
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=recipe.lr, total_steps=total, pct_start=recipe.warmup_fraction, anneal_strategy="cos"
    )


def augment_batch(images: torch.Tensor, recipe: Recipe, background: float) -> torch.Tensor:
    """Random horizontal flips and random crops of a normalised batch ``[B, C, H, W]`` (a new tensor).

    ``background`` is the normalised value of a black pixel, used for the padding.
    """
    if not recipe.flip and recipe.crop_padding == 0:
        return images
    import torch

    b, _, h, w = images.shape
    if recipe.flip:
        flip = (torch.rand(b) < 0.5).view(b, 1, 1, 1)
        images = torch.where(flip, images.flip(3), images)
    p = recipe.crop_padding
    if p:
        padded = torch.nn.functional.pad(images, (p, p, p, p), value=background)
        dy = torch.randint(0, 2 * p + 1, (b,))
        dx = torch.randint(0, 2 * p + 1, (b,))
        rows = (dy[:, None] + torch.arange(h))[:, :, None]  # [B, H, 1]
        cols = (dx[:, None] + torch.arange(w))[:, None, :]  # [B, 1, W]
        images = padded[torch.arange(b)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)  # [B, H, W, C] -> NCHW
    return images
