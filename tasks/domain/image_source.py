"""Reads a set of images to score: an idx file (``.gz`` or not), a ``.npy`` array, or a folder of PNGs.

Runs where the scoring flow's read step runs (a Ray worker); local paths or any
fsspec URL (``s3://bucket/key``; the endpoint and credentials come from
``storage_options`` or the usual AWS environment). No Prefect, no MLflow here.

Example::

    images = read_images("s3://bucket/t10k-images-idx3-ubyte.gz", storage_options={...})
    images.pixels.shape   # (10000, 28, 28), uint8
    images.ids[:2]        # ['0', '1']
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import posixpath
import stat
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import fsspec
import numpy as np

from tasks.domain.urls import mask_url

IDX_IMAGES_MAGIC = 0x00000803
SIDE = 28
ACCEPTED = (
    "an idx image file (e.g. t10k-images-idx3-ubyte.gz), a .npy array of uint8 images [N, 28, 28] "
    "(or [N, 784], [N, 1, 28, 28]), or a folder of 28x28 PNG images"
)


# The most bytes one scoring input may take, read or decompressed (a gzip bomb, /dev/zero): 1.3 million images.
MAX_INPUT_BYTES = 1 << 30


class ImageSourceError(ValueError):
    """The scoring input is missing, empty or unreadable; the message names it and what is accepted."""


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """Images to score, with one id per image.

    Attributes:
        source: where they came from (credentials never included).
        ids: the image ids: the index in an idx/.npy file, the file name in a PNG folder.
        pixels: uint8 ``[N, 28, 28]``.
    """

    source: str
    ids: tuple[str, ...]
    pixels: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def chunk(self, start: int, stop: int) -> ImageSet:
        """Images ``start:stop`` (a view, no copy)."""
        return ImageSet(self.source, self.ids[start:stop], self.pixels[start:stop])


def read_images(url: str, storage_options: Mapping[str, Any] | None = None) -> ImageSet:
    """Read every image at ``url`` (file or PNG folder, local or fsspec URL).

    Raises:
        ImageSourceError: ``url`` does not exist, holds no image, or cannot be read as images.
    """
    source, url = url, mask_url(url)  # messages show the masked form only
    try:
        fs, path = fsspec.core.url_to_fs(source, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise ImageSourceError(
            f"Cannot open {url}: {type(exc).__name__}: {exc}. Pass a local path or an fsspec "
            "URL whose package is installed (s3:// needs s3fs)."
        ) from None
    try:
        is_dir = fs.isdir(path)
        exists = is_dir or fs.exists(path)
    except Exception as exc:  # noqa: BLE001 - storage errors become one clear message
        raise ImageSourceError(
            f"Cannot reach {url}: {type(exc).__name__}: {exc}. Check the URL and the storage credentials / endpoint."
        ) from None
    if not exists:
        raise ImageSourceError(f"The scoring input {url} does not exist. Pass {ACCEPTED}.")
    if is_dir:
        ids, pixels = _read_png_folder(fs, path, url)
    else:
        data = _read_regular_file(fs, path, url)
        name = posixpath.basename(path)
        if name.endswith(".npy"):
            pixels = _from_npy(data, url)
        elif "idx3" in name or name.endswith((".gz", "-ubyte")):
            pixels = _from_idx(data, url)
        else:
            raise ImageSourceError(f"{url}: unknown file type {name!r}. Pass {ACCEPTED}.")
        ids = tuple(str(i) for i in range(len(pixels)))
    if len(ids) == 0:
        raise ImageSourceError(f"The scoring input {url} holds no images. Pass {ACCEPTED} with at least one image.")
    return ImageSet(source=url, ids=ids, pixels=pixels)


def _read_regular_file(fs: Any, path: str, url: str) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_INPUT_BYTES` (a FIFO would hang, a device never end)."""
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise ImageSourceError(
                f"{url} is not a regular file (a pipe, device or socket), which scoring does not read. Pass {ACCEPTED}."
            )
    size = fs.size(path)
    if size is not None and size > MAX_INPUT_BYTES:
        raise ImageSourceError(
            f"{url} has {size} bytes; a scoring input may have at most {MAX_INPUT_BYTES}. Split it into several "
            "files and score each."
        )
    with fs.open(path, "rb") as f:
        return f.read(MAX_INPUT_BYTES + 1)


def _gunzip(data: bytes, url: str) -> bytes:
    """``data`` decompressed, stopping past :data:`MAX_INPUT_BYTES` (a small gzip may expand without bound)."""
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            while chunk := stream.read(1 << 20):
                out.write(chunk)
                if out.tell() > MAX_INPUT_BYTES:
                    raise ImageSourceError(
                        f"{url} expands to more than {MAX_INPUT_BYTES} bytes; a scoring input may have at most that "
                        "many. Split it into several files and score each."
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise ImageSourceError(f"{url} is not a readable gzip file ({exc}). Pass {ACCEPTED}.") from None
    return out.getvalue()


def _from_idx(data: bytes, url: str) -> np.ndarray:
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, url)
    if len(data) < 16 or struct.unpack(">I", data[:4])[0] != IDX_IMAGES_MAGIC:
        raise ImageSourceError(f"{url} is not an idx image file (wrong magic number). Pass {ACCEPTED}.")
    n, rows, cols = struct.unpack(">III", data[4:16])
    if (rows, cols) != (SIDE, SIDE):
        raise ImageSourceError(f"{url} holds {rows}x{cols} images; the model takes 28x28.")
    body = data[16:]
    if len(body) != n * rows * cols:
        raise ImageSourceError(
            f"{url} is truncated: its header announces {n} images ({n * rows * cols} bytes), "
            f"it holds {len(body)} bytes. Copy the file again."
        )
    return np.frombuffer(body, dtype=np.uint8).reshape(n, SIDE, SIDE)


def _from_npy(data: bytes, url: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ImageSourceError(f"{url} is not a readable .npy array ({exc}). Pass {ACCEPTED}.") from None
    if array.ndim == 2 and array.shape[1] == SIDE * SIDE or array.ndim == 4 and array.shape[1:] == (1, SIDE, SIDE):
        array = array.reshape(len(array), SIDE, SIDE)
    if array.ndim != 3 or array.shape[1:] != (SIDE, SIDE):
        raise ImageSourceError(
            f"{url} holds an array of shape {list(array.shape)}; expected [N, 28, 28], [N, 784] or [N, 1, 28, 28]."
        )
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
            raise ImageSourceError(f"{url} holds {array.dtype} values; expected uint8 pixels 0..255.")
        if array.size and not np.isfinite(array).all():
            raise ImageSourceError(
                f"{url} holds NaN or infinite values (first at image {int(np.argwhere(~np.isfinite(array))[0][0])}); "
                "expected pixels 0..255. Fix or drop those images."
            )
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ImageSourceError(f"{url} holds {array.dtype} values outside 0..255; expected uint8 pixels.")
        if np.issubdtype(array.dtype, np.floating) and array.size and 0 < array.max() <= 1:
            raise ImageSourceError(
                f"{url} holds {array.dtype} values in 0..1, which the model would read as black images: it takes "
                "pixels 0..255. Scale them first: np.rint(images * 255).astype(np.uint8)."
            )
        array = np.rint(array).astype(np.uint8)
    return array


def _read_png_folder(fs: Any, path: str, url: str) -> tuple[tuple[str, ...], np.ndarray]:
    from PIL import Image, UnidentifiedImageError
    from PIL.Image import DecompressionBombError

    names = sorted(p for p in fs.ls(path, detail=False) if p.lower().endswith(".png"))
    images = []
    for name in names:
        try:
            with fs.open(name, "rb") as f:
                image = Image.open(io.BytesIO(f.read()))
                image.load()
        except (UnidentifiedImageError, OSError, DecompressionBombError, ValueError) as exc:
            raise ImageSourceError(
                f"{url}: {posixpath.basename(name)} is not a readable PNG ({type(exc).__name__}: {exc})."
            ) from None
        if image.size != (SIDE, SIDE):
            raise ImageSourceError(
                f"{url}: {posixpath.basename(name)} is {image.size[0]}x{image.size[1]}; the model "
                "takes 28x28 grayscale images."
            )
        images.append(np.asarray(image.convert("L"), dtype=np.uint8))
    pixels = np.stack(images) if images else np.zeros((0, SIDE, SIDE), dtype=np.uint8)
    return tuple(posixpath.basename(n) for n in names), pixels


def write_png_folder(pixels: np.ndarray, folder: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Write uint8 ``[N, 28, 28]`` images as ``image_00000.png``... to ``folder``; return the names."""
    from PIL import Image

    fs, root = fsspec.core.url_to_fs(folder, **dict(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    names = []
    for i, image in enumerate(pixels):
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(image, dtype=np.uint8), mode="L").save(buffer, format="PNG")
        name = f"image_{i:05d}.png"
        fs.pipe_file(posixpath.join(root, name), buffer.getvalue())
        names.append(name)
    return names
