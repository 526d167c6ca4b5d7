"""The registered model's network: ResNet18 with a gray or RGB ``conv1``, torch only (no mlflow, no torchvision).

Runs where a network of the model is built: training's workers (the recipes' architectures other than
the tutorial's), the evaluate and register steps, and every process that loads a registered version.
MLflow ships this file with each version (``code_paths``, the ``code/`` folder of its pyfunc and pytorch
flavors) beside ``classifier_model.py``, which imports it; kept apart from that file so that training's
workers build the network without importing mlflow (its import costs each worker CPU and memory).

Example::

    network = build_network(10, "resnet18-1ch-small")                    # gray images
    network = build_network(3, "resnet18-1ch-small", in_channels=3)      # RGB images, 3 classes
    network = network_with_weights(state_dict, 10, "resnet18-1ch-small")   # eval mode; channels from the weights
    logits = forward_in_batches(network, pixels, lambda batch: batch.unsqueeze(1) / 255, batch_size=256)
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

# Each architecture's conv1 (kernel, stride, padding) and the first block's width (the later blocks double it).
# The names say "1ch" from when every model was gray; conv1 takes the ImageSpec's channels (1 or 3) in both.
# "resnet18-1ch" is the Ray Train tutorial's network (torchvision's ImageNet stem: 28x28 images reach the first
# block as 7x7). "resnet18-1ch-small" keeps the full resolution through conv1, so the first block sees 14x14,
# at half the width: the same compute per image (4x the area, a quarter of the channel products), a quarter
# of the weights (2.8M).
ARCHITECTURES = {"resnet18-1ch": (7, 2, 3, 64), "resnet18-1ch-small": (3, 1, 1, 32)}
ARCHITECTURE = "resnet18-1ch"  # what a model_config naming no architecture holds

# From this many images on, forward_in_batches scores with a ResNet18's scoring_copy: the copy costs ~15-60 ms;
# folding its BatchNorms and its products on small maps save more than that only on many images
# (docs/benchmarks.md, "The pipeline (kept)"; `python -m bench network`), so a 64-image call keeps
# the network as it is, the 10,000 test images do not.
SCORING_COPY_FROM_IMAGES = 2048


class _BasicBlock(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut (module names as torchvision's)."""

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(outputs)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = torch.nn.Sequential(
                torch.nn.Conv2d(inputs, outputs, 1, stride, bias=False), torch.nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class ResNet18(torch.nn.Module):
    """torchvision's ``resnet18`` with an ``in_channels``-channel ``conv1``: the same layers, names and state dict.

    ``architecture`` (a key of :data:`ARCHITECTURES`) sets ``conv1``'s kernel and stride and the widths;
    ``resnet18-1ch`` is torchvision's network exactly (with ``in_channels=3``, torchvision's ``resnet18``).

    Written out here, torch only, because importing torchvision costs every process that loads
    the model ~1.5 s of CPU (a serving worker, each batch-scoring worker, the evaluate step) for
    one class; ``tasks.domain.network.build_model`` (training) uses torchvision's, and a test checks
    that both give the same outputs from the same weights.
    """

    def __init__(self, num_classes: int = 10, architecture: str = ARCHITECTURE, in_channels: int = 1):
        super().__init__()
        kernel, stride, padding, base = ARCHITECTURES[architecture]
        self.conv1 = torch.nn.Conv2d(in_channels, base, kernel_size=kernel, stride=stride, padding=padding, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(base)
        self.relu = torch.nn.ReLU(inplace=True)
        self.maxpool = torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        widths = (base, 2 * base, 4 * base, 8 * base)
        for index, width in enumerate(widths):
            inputs, stride = (base, 1) if index == 0 else (widths[index - 1], 2)
            setattr(
                self,
                f"layer{index + 1}",
                torch.nn.Sequential(_BasicBlock(inputs, width, stride), _BasicBlock(width, width, 1)),
            )
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_network(num_classes: int = 10, architecture: str = ARCHITECTURE, in_channels: int = 1) -> torch.nn.Module:
    """ResNet18 of the given architecture (a key of :data:`ARCHITECTURES`) for images of ``in_channels`` channels
    (an ``ImageSpec``'s: 1 gray, 3 RGB) and ``num_classes`` classes, untrained."""
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"architecture={architecture!r} is unknown: this model code builds {', '.join(map(repr, ARCHITECTURES))}."
        )
    if in_channels not in (1, 3):
        raise ValueError(f"in_channels={in_channels!r}; the network takes 1 (gray) or 3 (RGB) channels.")
    return ResNet18(num_classes, architecture, in_channels)


def network_with_weights(
    state: dict[str, torch.Tensor], num_classes: int = 10, architecture: str = ARCHITECTURE
) -> torch.nn.Module:
    """The network holding the weights ``state``, in eval mode; its input channels are the weights' ``conv1``'s.

    Built on the meta device: the random initialisation, which the weights replace at once, is not
    computed (ResNet18's costs ~0.2-0.3 s of CPU, paid by every process that loads a version).
    """
    conv1 = state.get("conv1.weight")
    in_channels = int(conv1.shape[1]) if conv1 is not None and conv1.ndim == 4 else 1
    with torch.device("meta"):
        network = build_network(num_classes, architecture, in_channels)
    network.load_state_dict(state, assign=True)
    return network.eval()


class _SmallMapConv2d(torch.nn.Conv2d):
    """A convolution that, on a feature map of fewer pixels than its kernel has taps, runs as one matrix product.

    There every output pixel reads every input pixel, so the convolution is a dense ``[H*W*C_in, H'*W'*C_out]``
    matrix made of its taps: one product does the multiply-adds without those of the zero padding (a 3x3 kernel
    on a 2x2 map: 4 taps of 9 are inside it). 28x28 images reach the default network's last block as 2x2 maps,
    and the tutorial's last two blocks as 2x2 and 1x1. The same outputs to float rounding; larger maps go
    through the convolution. The matrix is built on first use, once per map size (e.g. 4 MB for 2x2 x 256
    channels).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # (height, width) -> the matrix on maps of that size, its bias, the output's height and width
        self._products: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int, int]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = x.shape
        (kernel_h, kernel_w), (pad_h, pad_w) = self.kernel_size, self.padding
        # A map too small for the kernel even padded: the convolution's own error.
        if height * width >= kernel_h * kernel_w or height + 2 * pad_h < kernel_h or width + 2 * pad_w < kernel_w:
            return super().forward(x)
        product = self._products.get((height, width))
        if product is None:  # two scoring threads may both build it: the same matrix, either is kept
            product = self._products[(height, width)] = self._dense_product(height, width)
        matrix, bias, out_height, out_width = product
        # Channels-last x is [N, H, W, C] in memory: the reshape is a view, and so is the result's permute.
        out = torch.addmm(bias, x.permute(0, 2, 3, 1).reshape(batch, -1), matrix)
        return out.view(batch, out_height, out_width, -1).permute(0, 3, 1, 2)

    def _dense_product(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        (kernel_h, kernel_w), (stride_h, stride_w), (pad_h, pad_w) = self.kernel_size, self.stride, self.padding
        out_height = (height + 2 * pad_h - kernel_h) // stride_h + 1
        out_width = (width + 2 * pad_w - kernel_w) // stride_w + 1
        weight = self.weight.detach()
        matrix = weight.new_zeros(height, width, self.in_channels, out_height, out_width, self.out_channels)
        for row, col, out_row, out_col in itertools.product(
            range(height), range(width), range(out_height), range(out_width)
        ):
            tap_row, tap_col = row - out_row * stride_h + pad_h, col - out_col * stride_w + pad_w
            if 0 <= tap_row < kernel_h and 0 <= tap_col < kernel_w:
                matrix[row, col, :, out_row, out_col, :] = weight[:, :, tap_row, tap_col].t()
        bias = self.bias.detach() if self.bias is not None else weight.new_zeros(self.out_channels)
        return (
            matrix.view(height * width * self.in_channels, -1),
            bias.repeat(out_height * out_width),
            out_height,
            out_width,
        )

    @classmethod
    def replacing(cls, conv: torch.nn.Conv2d) -> torch.nn.Conv2d:
        """``conv`` as one of these, sharing its weights; a convolution this cannot stand for, as it is."""
        if (
            conv.groups != 1
            or conv.dilation != (1, 1)
            or conv.padding_mode != "zeros"
            or isinstance(conv.padding, str)
            or conv.kernel_size == (1, 1)
        ):
            return conv
        with torch.device("meta"):
            small = cls(
                conv.in_channels,
                conv.out_channels,
                conv.kernel_size,
                conv.stride,
                conv.padding,
                bias=conv.bias is not None,
            )
        small.weight, small.bias = conv.weight, conv.bias
        return small


def scoring_copy(network: ResNet18) -> ResNet18:
    """An eval-mode copy of ``network`` for scoring many images: each BatchNorm folded into the convolution before
    it, and convolutions that run on maps smaller than their kernel done as matrix products (:class:`_SmallMapConv2d`).

    The same outputs to float rounding, with one pass over every feature map fewer per convolution and fewer
    multiply-adds in the last blocks. For scoring only: the copy's state dict is not the model's (no BatchNorm
    entries, convolutions with a bias), so save, register or train ``network``, which is left as it was.
    """
    scoring = copy.deepcopy(network).eval()
    for owner in list(scoring.modules()):
        # conv1/bn1 of the stem and of each block, conv2/bn2 of each block, a block's downsample (conv, norm).
        for conv_name, norm_name in (("conv1", "bn1"), ("conv2", "bn2"), ("0", "1")):
            conv, norm = getattr(owner, conv_name, None), getattr(owner, norm_name, None)
            if isinstance(conv, torch.nn.Conv2d) and isinstance(norm, torch.nn.BatchNorm2d):
                setattr(owner, conv_name, _SmallMapConv2d.replacing(fuse_conv_bn_eval(conv, norm)))
                setattr(owner, norm_name, torch.nn.Identity())
    return scoring


def forward_in_batches(
    network: torch.nn.Module, images: torch.Tensor, prepare: Callable[[torch.Tensor], torch.Tensor], batch_size: int
) -> torch.Tensor:
    """``network``'s outputs ``[N, classes]`` for ``images`` (at least one), ``batch_size`` images per forward pass.

    ``prepare`` turns a slice of ``images`` into the network's input. Eval mode, no autograd, channels-last weights
    and inputs (oneDNN's convolutions run ~12% faster on the CPU in that layout); ``network`` is converted in place.
    A :class:`ResNet18` given :data:`SCORING_COPY_FROM_IMAGES` images or more scores through its :func:`scoring_copy`.

    With torch allowed several threads, as many threads of one intra-op thread each take the batches one at a
    time, in turn. On ResNet18's small feature maps that keeps the cores busier than splitting every operation
    across them, and a thread slowed by another process on its core takes fewer batches instead of holding the
    others up (docs/benchmarks.md, "The pipeline (kept)"). The evaluate step and the registered
    model's ``predict`` both come here, so they give the same labels.
    """
    if isinstance(network, ResNet18) and len(images) >= SCORING_COPY_FROM_IMAGES:
        network = scoring_copy(network)
    network = network.eval().to(memory_format=torch.channels_last)
    starts = range(0, len(images), batch_size)
    outputs: list[torch.Tensor | None] = [None] * len(starts)
    turns = itertools.count()  # the next batch to take: next() on it is atomic in CPython
    failed = threading.Event()  # a batch failed: the other threads take no more

    def take_batches(intra_op_threads: int | None) -> None:
        if intra_op_threads is not None:  # torch's thread count is per thread: this one's only
            torch.set_num_threads(intra_op_threads)
        with torch.inference_mode():  # also per thread
            for index in turns:
                if index >= len(starts) or failed.is_set():
                    return
                try:
                    batch = prepare(images[starts[index] : starts[index] + batch_size])
                    outputs[index] = network(batch.contiguous(memory_format=torch.channels_last))
                except BaseException:
                    failed.set()
                    raise

    threads = min(torch.get_num_threads(), len(starts))
    if threads < 2:
        take_batches(None)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="forward") as pool:
            for done in [pool.submit(take_batches, 1) for _ in range(threads)]:
                done.result()  # a batch's error, raised here
    return torch.cat(outputs)
