"""Reads a set of images to score: an image folder, a manifest, a single image, an idx file or a ``.npy`` array.

Runs where the scoring flow's read step runs (a Ray worker); local paths or any fsspec URL
(``s3://bucket/key``; the endpoint and credentials come from ``storage_options`` or the usual AWS
environment). No Prefect, no MLflow here. Encoded files are kept encoded: the registered model
decodes, converts and resizes them (``image_preprocessing``) in the scoring workers, as it does
for a served request; here each file is fetched and its header checked, so that a missing or
unreadable file fails the run before any scoring.

Inputs:

* a folder: every image file under it (PNG, JPEG, WebP, BMP, GIF, TIFF; any size, gray or RGB),
  nested folders included (``ROOT/<class>/<file>``, ``ROOT/train/<class>/<file>``, ...); an image's
  id is its path relative to the folder and its label the name of the folder holding it;
* a manifest (``.csv`` or ``.parquet``) with a ``path`` column (and optionally ``label``): paths
  relative to the manifest's folder, or URLs (``s3://...``, ``https://...``); an image's id is its
  ``path`` as written;
* one image file; an idx image file (``.gz`` or not); a ``.npy`` array of images (pixel arrays the
  model takes); ids are the indices.

Example::

    images = read_images("s3://bucket/photos", storage_options={...})
    images.ids[:2]        # ('cat/001.jpg', 'dog/002.png')
    images.model_input()  # DataFrame with a column 'image' of the files' bytes
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
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
MANIFEST_EXTENSIONS = (".csv", ".parquet")
ACCEPTED = (
    "a folder of images (PNG, JPEG, ...; nested class folders allowed), a manifest (.csv or .parquet with a "
    "'path' column), one image file, an idx image file (e.g. t10k-images-idx3-ubyte.gz) or a .npy array of "
    "images ([N, H, W], [N, H, W, C] or [N, C, H, W], values 0..255)"
)


# The most bytes one scoring input may take, read or decompressed (a gzip bomb, /dev/zero): 1.3 million images.
MAX_INPUT_BYTES = 1 << 30


class ImageSourceError(ValueError):
    """The scoring input is missing, empty or unreadable; the message names it and what is accepted."""


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """Images to score, with one id per image: pixel arrays (idx, ``.npy``) or encoded files (the rest).

    Attributes:
        source: where they came from (credentials never included).
        ids: the image ids: the path relative to the folder or as the manifest writes it; the index in an
            idx or ``.npy`` file.
        pixels: the arrays of an idx or ``.npy`` file (uint8 ``[N, H, W]``, ``[N, H, W, C]`` or ``[N, C, H, W]``);
            None for files.
        files: each image file's bytes, in ``ids`` order; None for arrays.
        labels: the label the source gives each image (its folder's name, the manifest's ``label``); None
            when it gives none.
    """

    source: str
    ids: tuple[str, ...]
    pixels: np.ndarray | None = None
    files: tuple[bytes, ...] | None = None
    labels: tuple[str | None, ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def chunk(self, start: int, stop: int) -> ImageSet:
        """Images ``start:stop`` (views, no copy of the pixels)."""
        return ImageSet(
            self.source,
            self.ids[start:stop],
            None if self.pixels is None else self.pixels[start:stop],
            None if self.files is None else self.files[start:stop],
            None if self.labels is None else self.labels[start:stop],
        )

    def model_input(self) -> Any:
        """What the registered model's ``predict`` takes: the pixel arrays, or a DataFrame column ``image``."""
        if self.pixels is not None:
            return self.pixels
        import pandas as pd

        return pd.DataFrame({"image": list(self.files or ())})


def read_images(url: str, storage_options: Mapping[str, Any] | None = None) -> ImageSet:
    """Read every image at ``url`` (see the module's inputs; local or fsspec URL).

    Raises:
        ImageSourceError: ``url`` (or a file it names) does not exist, holds no image, or cannot be read as images.
    """
    source, url = url, mask_url(url)  # messages show the masked form only
    options = dict(storage_options or {})
    fs, path = _filesystem(source, options, url)
    try:
        # fsspec reuses a filesystem and its listings across calls in a process (a Ray worker scores many runs):
        # list what is there now.
        fs.invalidate_cache(path)
        is_dir = fs.isdir(path)
        exists = is_dir or fs.exists(path)
    except Exception as exc:  # noqa: BLE001 - storage errors become one clear message
        raise ImageSourceError(
            f"Cannot reach {url}: {type(exc).__name__}: {exc}. Check the URL and the storage credentials / endpoint."
        ) from None
    if not exists:
        raise ImageSourceError(f"The scoring input {url} does not exist. Pass {ACCEPTED}.")
    name = posixpath.basename(path.rstrip("/"))
    if is_dir:
        images = _read_folder(fs, path, url)
    elif name.lower().endswith(MANIFEST_EXTENSIONS):
        from tasks.domain.scoring_manifest import read_manifest

        images = read_manifest(_read_regular_file(fs, path, url), fs, path, url, options)
    elif name.lower().endswith(IMAGE_EXTENSIONS):
        images = ImageSet(url, (name,), files=(checked_image(_read_regular_file(fs, path, url), name, url),))
    else:
        data = _read_regular_file(fs, path, url)
        if name.endswith(".npy"):
            pixels = _from_npy(data, url)
        elif "idx3" in name or name.endswith((".gz", "-ubyte")):
            pixels = _from_idx(data, url)
        else:
            raise ImageSourceError(f"{url}: unknown file type {name!r}. Pass {ACCEPTED}.")
        images = ImageSet(url, tuple(str(i) for i in range(len(pixels))), pixels=pixels)
    if len(images) == 0:
        raise ImageSourceError(f"The scoring input {url} holds no images. Pass {ACCEPTED} with at least one image.")
    return images


def _filesystem(source: str, options: dict[str, Any], url: str) -> tuple[Any, str]:
    try:
        return fsspec.core.url_to_fs(source, **options)
    except (ImportError, ValueError) as exc:
        raise ImageSourceError(
            f"Cannot open {url}: {type(exc).__name__}: {exc}. Pass a local path or an fsspec "
            "URL whose package is installed (s3:// needs s3fs)."
        ) from None


def checked_image(data: bytes, name: str, url: str) -> bytes:
    """``data`` if its header is an image's (format and size read, pixels not decoded), else an error naming it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.size  # noqa: B018 - the header's size: read, or the error below
    except Exception as exc:  # noqa: BLE001 - any decoder complaint about a file becomes one message
        known = type(exc).__name__ == "UnidentifiedImageError"  # its text names an io.BytesIO object
        reason = "no known image format" if known else f"{type(exc).__name__}: {str(exc)[:200]}"
        raise ImageSourceError(
            f"{url}: {name} is not a readable image ({reason}). Remove it or replace it with a PNG or JPEG file."
        ) from None
    return data


def _read_folder(fs: Any, path: str, url: str) -> ImageSet:
    """Every image file under ``path`` (nested folders too), sorted by relative path; hidden files skipped."""
    root = path.rstrip("/")
    listing = fs.find(root, detail=True)
    found = sorted(
        p
        for p in listing
        if p.lower().endswith(IMAGE_EXTENSIONS) and not any(part.startswith(".") for part in _relative(p, root))
    )
    for p in found:
        if listing[p].get("type") != "file":  # a pipe would hang the read, a device never end
            raise ImageSourceError(
                f"{url}: {'/'.join(_relative(p, root))} is not a regular file (a pipe, device or socket), which "
                "scoring does not read. Remove it from the folder."
            )
    contents = fs.cat(found, on_error="return") if found else {}
    ids, files, labels = [], [], []
    for full in found:
        parts = _relative(full, root)
        name = "/".join(parts)
        data = contents.get(full)
        if isinstance(data, BaseException) or data is None:
            raise ImageSourceError(f"{url}: cannot read {name} ({type(data).__name__}: {data}).")
        ids.append(name)
        files.append(checked_image(data, name, url))
        labels.append(parts[-2] if len(parts) > 1 else None)
    has_labels = any(label is not None for label in labels)
    return ImageSet(url, tuple(ids), files=tuple(files), labels=tuple(labels) if has_labels else None)


def _relative(full: str, root: str) -> list[str]:
    return posixpath.relpath(full, root).split("/")


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
    body = data[16:]
    if len(body) != n * rows * cols:
        raise ImageSourceError(
            f"{url} is truncated: its header announces {n} images ({n * rows * cols} bytes), "
            f"it holds {len(body)} bytes. Copy the file again."
        )
    return np.frombuffer(body, dtype=np.uint8).reshape(n, rows, cols)


def _from_npy(data: bytes, url: str) -> np.ndarray:
    """The images of a ``.npy`` file; ``[N, 784]`` and ``[N, 1, 28, 28]`` as ``[N, 28, 28]``, floats as uint8."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ImageSourceError(f"{url} is not a readable .npy array ({exc}). Pass {ACCEPTED}.") from None
    side = 28  # the built-in data sets' images, which a .npy of rows or single-channel planes holds
    if array.ndim == 2 and array.shape[1] == side * side or array.ndim == 4 and array.shape[1:] == (1, side, side):
        array = array.reshape(len(array), side, side)
    if array.ndim not in (3, 4):
        raise ImageSourceError(
            f"{url} holds an array of shape {list(array.shape)}; expected images [N, H, W], [N, H, W, C], "
            "[N, C, H, W] or [N, 784]."
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


def write_png_folder(pixels: np.ndarray, folder: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Write uint8 images (``[N, H, W]`` gray or ``[N, H, W, 3]`` RGB) as ``image_00000.png``... to ``folder``;
    return the names."""
    from PIL import Image

    fs, root = fsspec.core.url_to_fs(folder, **dict(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    names = []
    for i, image in enumerate(pixels):
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
        name = f"image_{i:05d}.png"
        fs.pipe_file(posixpath.join(root, name), buffer.getvalue())
        names.append(name)
    return names
