"""Reading (Fashion-)MNIST's idx files: one split as uint8 images and int64 labels. Runs on driver and workers.

Reads the gzip'd files as downloaded, or decompressed ones; every corruption is reported
with the file's name and what to do.

Example::

    images, labels = load_fashion_mnist_split(files.folder, train=False, limit=1000)
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib

import torch

# The idx magic numbers of the images and labels files, and each split's two files.
IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
SPLIT_FILES = {
    True: ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    False: ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def load_fashion_mnist_split(
    folder: str | os.PathLike, train: bool, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one split of (Fashion-)MNIST from its idx files in ``folder``.

    Reads ``train-*`` or ``t10k-*`` ``images-idx3-ubyte`` and ``labels-idx1-ubyte``,
    gzip'd (``.gz``, as downloaded) or already decompressed.

    Args:
        folder: the folder holding the files, e.g. ``fetch_dataset(...).folder``.
        train: the training split (60,000 images) if true, else the test split (10,000).
        limit: read only the first ``limit`` images and labels (``None``: all).

    Returns:
        ``(images, labels)``: a uint8 tensor ``[N, 28, 28]`` and an int64 tensor ``[N]``.

    Raises:
        FileNotFoundError: a file is missing from ``folder``.
        ValueError: a file is corrupt or not an idx file of the expected kind (the
            message names it), or ``limit`` is negative.

    Example::

        images, labels = load_fashion_mnist_split(files.folder, train=False, limit=1000)
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit={limit!r} must be None or an int >= 0.")
    images_name, labels_name = SPLIT_FILES[bool(train)]
    images_dims, images_data = _read_idx(find_idx_file(folder, images_name), IMAGES_MAGIC, limit)
    labels_dims, labels_data = _read_idx(find_idx_file(folder, labels_name), LABELS_MAGIC, limit)
    if images_dims[0] != labels_dims[0]:
        raise ValueError(
            f"{folder}: {images_name} holds {images_dims[0]} images but {labels_name} "
            f"{labels_dims[0]} labels; the files are from different data sets. Fetch them again."
        )
    n = len(labels_data)
    images = torch.frombuffer(bytearray(images_data), dtype=torch.uint8).view(n, *images_dims[1:])
    labels = torch.frombuffer(bytearray(labels_data), dtype=torch.uint8).to(torch.int64)
    return images, labels


def find_idx_file(folder: str | os.PathLike, gz_name: str) -> str:
    """The path of ``gz_name`` in ``folder``, gzip'd or decompressed."""
    for candidate in (gz_name, gz_name[: -len(".gz")]):
        path = os.path.join(os.fspath(folder), candidate)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"{gz_name} (or its decompressed form) is not in {os.fspath(folder)!r}. "
        "Run fetch_dataset first and pass its .folder."
    )


def check_idx_magic(path: str, head: bytes, magic: int) -> int:
    """Validate an idx header's magic number; return the number of dimensions.

    Raises:
        ValueError: not an idx file of the expected kind; the message says what to do.
    """
    if len(head) < 4 or struct.unpack(">I", head[:4])[0] != magic:
        got = f"0x{struct.unpack('>I', head[:4])[0]:08x}" if len(head) >= 4 else f"{len(head)} byte(s)"
        kind = "image" if magic == IMAGES_MAGIC else "label"
        raise ValueError(
            f"{path} is not an idx {kind} file: magic number {got}, expected 0x{magic:08x}. "
            "The file is corrupt or of another data set; delete it and run fetch_dataset "
            "again (it checks md5s)."
        )
    return magic & 0xFF


def _read_idx(path: str, magic: int, limit: int | None) -> tuple[tuple[int, ...], bytes]:
    """Return the dimensions (first one cut to ``limit``) and the data bytes of an idx file."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            ndim = check_idx_magic(path, f.read(4), magic)
            raw_dims = f.read(4 * ndim)
            if len(raw_dims) != 4 * ndim:
                raise ValueError("the header is truncated")
            dims = struct.unpack(f">{ndim}I", raw_dims)
            count = dims[0] if limit is None else min(dims[0], limit)
            want = count * math.prod(dims[1:])
            data = f.read(want)
            if len(data) != want:
                raise ValueError(f"the header says {dims[0]} items of shape {list(dims[1:])} but the data ends early")
            # Reading to the end also makes gzip check the file's CRC.
            if count == dims[0] and f.read(1):
                raise ValueError("there are bytes after the data the header announces")
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(path):
            raise
        raise ValueError(
            f"{path} is corrupt ({type(exc).__name__}: {exc}). Delete it and run fetch_dataset again (it checks md5s)."
        ) from None
    return (count, *dims[1:]), data
