"""Image sources for the data tests: generated class folders (gray or RGB) and a moto S3 server with its env."""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np

CLASS_COLORS = {"circle": (230, 40, 40), "square": (40, 200, 40), "stripe": (40, 40, 230)}
# The fake credentials moto_s3_env puts in the environment: tests grep for them where they must never be.
FAKE_ACCESS_KEY = "AKIADATATESTFAKE"
FAKE_SECRET_KEY = "data-test-secret-6f1c"


def png_bytes(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def shape_image(kind: str, index: int, size: int = 32, rgb: bool = True) -> np.ndarray:
    """A small image of class ``kind`` (a shape in its color on noise), different for every ``index``."""
    rng = np.random.default_rng(index * 7919 + sum(map(ord, kind)))
    image = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
    color = np.array(CLASS_COLORS[kind], dtype=np.uint8)
    c, r = size // 2 + rng.integers(-3, 4), size // 4 + rng.integers(0, 3)
    yy, xx = np.mgrid[:size, :size]
    if kind == "circle":
        mask = (yy - c) ** 2 + (xx - c) ** 2 < r * r
    elif kind == "square":
        mask = (abs(yy - c) < r) & (abs(xx - c) < r)
    else:
        mask = (xx // 4) % 2 == 0
    image[mask] = color
    return image if rgb else image.mean(axis=2).astype(np.uint8)


def write_shapes(root, per_class: int = 30, size: int = 32, rgb: bool = True, splits: bool = False, start: int = 0):
    """``root/<class>/<n>.png`` (or ``root/{train,test}/<class>/...`` with ``splits``: every 5th to test)."""
    written = []
    for kind in CLASS_COLORS:
        for i in range(start, start + per_class):
            split = ("test" if i % 5 == 0 else "train") if splits else ""
            folder = os.path.join(str(root), split, kind) if split else os.path.join(str(root), kind)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{i:04d}.png")
            with open(path, "wb") as f:
                f.write(png_bytes(shape_image(kind, i, size, rgb)))
            written.append(path)
    return written


@contextlib.contextmanager
def moto_s3_env(bucket: str):
    """A moto S3 server on 127.0.0.1 with fake credentials in the environment (restored after) and ``bucket``."""
    import s3fs
    from conftest import free_port
    from moto.server import ThreadedMotoServer

    from tasks.domain.environ import environment

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    fake_credentials = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        with environment(fake_credentials):
            s3fs.S3FileSystem.clear_instance_cache()
            s3fs.S3FileSystem().mkdir(bucket)
            yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
