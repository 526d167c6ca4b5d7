"""Placing a data set's raw files where ``torchvision.datasets.FashionMNIST`` looks for them. Runs anywhere.

Used by ``make tutorial MIRROR=...`` so the Ray Train tutorial, unchanged, reads a mirror
instead of the internet.

Example::

    torchvision_layout("/data/fashion-mnist", "/tmp/data")
    torchvision.datasets.FashionMNIST("/tmp/data", train=True, download=True)  # downloads nothing
"""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import uuid
import zlib

from tasks.domain.idx_files import IMAGES_MAGIC, LABELS_MAGIC, SPLIT_FILES, check_idx_magic, find_idx_file

CHUNK_BYTES = 1 << 20


def torchvision_layout(folder: str | os.PathLike, root: str | os.PathLike, dataset_class: str = "FashionMNIST") -> str:
    """Place the four raw files, decompressed, where torchvision looks for them.

    ``torchvision.datasets.FashionMNIST(root, download=True)`` then finds
    ``root/FashionMNIST/raw/<name>-ubyte`` and downloads nothing. Files already
    there with the right size are kept; others are written under a temporary
    name and renamed.

    Args:
        folder: the folder holding the ``.gz`` files, e.g. ``fetch_dataset(...).folder``.
        root: the ``root`` to pass to torchvision.
        dataset_class: torchvision's class name, ``"FashionMNIST"`` or ``"MNIST"``.

    Returns:
        The raw folder written, ``root/<dataset_class>/raw``.

    Raises:
        FileNotFoundError: a file is missing from ``folder``.
        ValueError: a file is corrupt or not an idx file.

    Example::

        torchvision_layout(files.folder, "/tmp/tv")
        torchvision.datasets.FashionMNIST("/tmp/tv", train=True, download=True)
    """
    raw = os.path.join(os.fspath(root), dataset_class, "raw")
    os.makedirs(raw, exist_ok=True)
    for train in (True, False):
        for gz_name, magic in zip(SPLIT_FILES[train], (IMAGES_MAGIC, LABELS_MAGIC)):
            src = find_idx_file(folder, gz_name)
            dest = os.path.join(raw, gz_name[: -len(".gz")])
            compressed = src.endswith(".gz")
            size = _gzip_size(src) if compressed else os.path.getsize(src)
            if os.path.isfile(dest) and os.path.getsize(dest) % (1 << 32) == size:
                continue
            tmp = f"{dest}.{uuid.uuid4().hex}.part"
            try:
                with (gzip.open if compressed else open)(src, "rb") as f, open(tmp, "wb") as out:
                    head = f.read(4)
                    check_idx_magic(src, head, magic)
                    out.write(head)
                    shutil.copyfileobj(f, out, CHUNK_BYTES)
                os.replace(tmp, dest)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(
                    f"{src} is corrupt ({type(exc).__name__}: {exc}). Delete it and run "
                    "fetch_dataset again (it checks md5s)."
                ) from None
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
    return raw


def _gzip_size(path: str) -> int:
    """The uncompressed size modulo 2**32, from the gzip trailer."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 4:
            return -1
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0]
