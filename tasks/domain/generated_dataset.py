"""A small generated data set in (Fashion-)MNIST's exact idx format, for tests and CI (no internet). Runs anywhere.

Example::

    md5s = write_idx_dataset("/tmp/mirror", n_train=256, n_test=64)
    files = fetch_dataset("fashion-mnist", "/tmp/cache", mirrors=["/tmp/mirror"], md5s=md5s)
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import uuid

import torch

from tasks.domain.dataset_registry import MNIST_FILES
from tasks.domain.idx_files import IMAGES_MAGIC, LABELS_MAGIC, SPLIT_FILES


def write_idx_dataset(folder: str | os.PathLike, n_train: int, n_test: int, seed: int = 0) -> dict[str, str]:
    """Write a small generated data set in (Fashion-)MNIST's exact format; return its md5s.

    Four gzip'd idx files with the official names: 28x28 uint8 images and labels
    0..9. Each class has a bright horizontal band at its own height over noise,
    so a model can learn it. The same arguments always write the same bytes.

    Args:
        folder: where to write (created if missing).
        n_train: number of training images.
        n_test: number of test images.
        seed: random seed of the images and labels.

    Returns:
        filename -> md5, to pass as ``md5s=`` to :func:`fetch_dataset`.

    Raises:
        ValueError: a negative count.

    Example::

        md5s = write_idx_dataset("/tmp/mirror", n_train=256, n_test=64)
        files = fetch_dataset("fashion-mnist", "/tmp/cache", mirrors=["/tmp/mirror"], md5s=md5s)
    """
    for field, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{field}={value!r} must be an int >= 0.")
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    md5s: dict[str, str] = {}
    for train, n in ((True, n_train), (False, n_test)):
        labels = torch.randint(0, 10, (n,), generator=generator, dtype=torch.int64)
        noise = torch.randint(0, 64, (n, 28, 28), generator=generator, dtype=torch.int64)
        start = 1 + 2 * labels  # band rows [start, start + 6), all inside the 28 rows
        rows = torch.arange(28)
        band = (rows >= start[:, None]) & (rows < start[:, None] + 6)
        images = (noise + 160 * band[:, :, None]).to(torch.uint8)
        images_name, labels_name = SPLIT_FILES[train]
        payloads = {
            images_name: struct.pack(">IIII", IMAGES_MAGIC, n, 28, 28) + images.numpy().tobytes(),
            labels_name: struct.pack(">II", LABELS_MAGIC, n) + labels.to(torch.uint8).numpy().tobytes(),
        }
        for name, payload in payloads.items():
            data = gzip.compress(payload, mtime=0)  # mtime=0: same bytes, same md5 every time
            path = os.path.join(folder, name)
            tmp = f"{path}.{uuid.uuid4().hex}.part"
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
            md5s[name] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    return {name: md5s[name] for name in MNIST_FILES}
