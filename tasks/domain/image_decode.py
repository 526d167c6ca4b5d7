"""Decoding image files with torchvision's decoders: what a file is, and its pixels at an ImageSpec. Runs anywhere.

:func:`inspect_image` decodes a file once and says what it is (size, channels) or why it is not an
image; :func:`decode_to_spec` gives uint8 ``[C, H, W]`` pixels converted to the spec's channels and
resized to its size (bilinear, antialiased: the same in training, evaluation and serving).
PNG, JPEG, WebP and GIF decode (``torchvision.io.decode_image``).

Example::

    facts = inspect_image(data)          # ImageFacts(width=28, height=28, channels=1, error="")
    pixels = decode_to_spec(data, spec)  # uint8 [spec.channels, spec.height, spec.width]
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    """What decoding a file found: its size and channels (3 for color), or ``error`` when it is no image."""

    width: int = 0
    height: int = 0
    channels: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def _decode(data: bytes, mode: str = "UNCHANGED") -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=getattr(ImageReadMode, mode))


def inspect_image(data: bytes) -> ImageFacts:
    """Decode ``data`` once; never raises (an empty, corrupt or non-image file gets ``error``)."""
    if not data:
        return ImageFacts(error="empty file (0 bytes)")
    try:
        pixels = _decode(data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure means "not a usable image"
        return ImageFacts(error=f"not a decodable image ({str(exc).splitlines()[0][:120] or type(exc).__name__})")
    if pixels.ndim != 3 or pixels.shape[1] == 0 or pixels.shape[2] == 0:
        return ImageFacts(error=f"decoded to an empty array of shape {list(pixels.shape)}")
    channels = int(pixels.shape[0])
    # Gray+alpha counts as gray; RGB, RGBA and a palette decoded to RGB count as color.
    return ImageFacts(width=int(pixels.shape[2]), height=int(pixels.shape[1]), channels=3 if channels >= 3 else 1)


def decode_to_spec(data: bytes, channels: int, height: int, width: int) -> torch.Tensor:
    """uint8 ``[channels, height, width]`` pixels of ``data`` (converted, and resized when its size differs)."""
    pixels = _decode(data, "RGB" if channels == 3 else "GRAY")
    if pixels.shape[1:] != (height, width):
        from torchvision.transforms.v2.functional import resize

        pixels = resize(pixels, [height, width], antialias=True)
    return pixels
