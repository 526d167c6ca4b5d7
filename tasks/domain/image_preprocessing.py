"""The one preprocessing of training and serving: decode, convert to the model's channels, resize to its size.

Runs wherever images meet the network: training's data loading (workers), the registered model's
``predict`` (a user's process, ``mlflow models serve``, batch-scoring workers). Shipped with every
registered version (``code_paths``, the version's ``code/`` folder) beside ``classifier_model.py``:
it imports torch, numpy, PIL and ``image_spec`` only (never torchvision, mlflow or this repository).

The steps, in this order, are the same on every path:

1. channels: PIL's ``convert("L")``/``convert("RGB")`` for encoded images (:func:`decode_image`);
   :func:`convert_channels` does the same to pixel arrays (gray repeated to RGB, RGB to gray with
   PIL's integer luma formula, alpha dropped), so an RGB array and its PNG give the same pixels;
2. size: :func:`resize`, bilinear with antialiasing, as ``torchvision.transforms.v2.functional.resize``
   (``antialias=True``) on a tensor; uint8 in gives uint8 out (rounded), float gives float.

Example::

    pixels = decode_image(png_bytes, channels=3)          # uint8 [3, H, W]
    batch = fit_to_spec(pixels[None], 3, 32, 32)          # uint8 [1, 3, 32, 32]
"""

from __future__ import annotations

import io

import numpy as np
import torch

if __package__:  # this repository's tasks.domain
    from .image_spec import CHANNEL_MODES
else:  # a registered version's code/ folder
    from image_spec import CHANNEL_MODES

# PIL's convert("L") of 8-bit RGB: (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16 (ITU-R 601-2 luma).
LUMA_WEIGHTS = (19595, 38470, 7471)
# Channel counts a pixel array may have: gray, RGB, RGBA (alpha dropped).
ARRAY_CHANNELS = (1, 3, 4)


def decode_image(data: bytes, channels: int) -> torch.Tensor:
    """Encoded image bytes (PNG, JPEG, WebP, BMP, ... what PIL reads) -> uint8 ``[channels, H, W]``.

    Raises:
        PIL.UnidentifiedImageError, OSError, PIL.Image.DecompressionBombError: not a readable image.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        array = np.array(image.convert(CHANNEL_MODES[channels]), dtype=np.uint8)  # writable: torch takes it as is
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


def convert_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """``[N, C, H, W]`` images (C = 1, 3 or 4) with ``channels`` (1 or 3) channels, as PIL's ``convert`` makes them.

    Gray to RGB repeats the channel; RGB to gray is PIL's luma (integer arithmetic for uint8, the same
    weights for float); a fourth (alpha) channel is dropped. The dtype is kept.
    """
    have = images.shape[1]
    if have not in ARRAY_CHANNELS:
        raise ValueError(f"images have {have} channels; expected one of {ARRAY_CHANNELS}.")
    if have == 4:
        images, have = images[:, :3], 3
    if have == channels:
        return images
    if channels == 3:
        return images.expand(-1, 3, -1, -1)
    r, g, b = (images[:, i : i + 1] for i in range(3))
    wr, wg, wb = LUMA_WEIGHTS
    if images.dtype == torch.uint8:
        luma = (r.to(torch.int32) * wr + g.to(torch.int32) * wg + b.to(torch.int32) * wb + 0x8000) >> 16
        return luma.to(torch.uint8)
    return (r * wr + g * wg + b * wb) / 65536.0


def resize(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``[N, C, h, w]`` images resized to ``[N, C, height, width]``: bilinear, antialiased (as torchvision's
    ``resize(..., antialias=True)``). Images already of that size come back as they are; uint8 stays uint8."""
    if tuple(images.shape[-2:]) == (height, width):
        return images
    resized = torch.nn.functional.interpolate(
        images.to(torch.float32), size=(height, width), mode="bilinear", antialias=True, align_corners=False
    )
    if images.dtype == torch.uint8:
        return resized.round_().clamp_(0, 255).to(torch.uint8)
    return resized


def fit_to_spec(images: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """``[N, C, h, w]`` images (any size, 1, 3 or 4 channels) as the model takes them: ``[N, channels, height,
    width]``, channels first converted, then resized. The one preprocessing; training's loader calls it too."""
    return resize(convert_channels(images, channels), height, width)
