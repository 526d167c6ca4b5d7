"""Atomic writes on the local disk: a temporary file in the same folder, then one rename. Driver and workers.

Readers see the old file or the new one, never a part: ``os.replace`` within one
filesystem is atomic. Object stores need none of this (one PUT is atomic).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` as the whole content of ``path`` (flushed to disk before the rename)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    _replace_with(path, write)


def atomic_copy(src: str, dest: str) -> None:
    """Copy the file ``src`` to ``dest`` so that ``dest`` appears complete or not at all."""
    _replace_with(dest, lambda tmp: shutil.copyfile(src, tmp))


def _replace_with(path: str, fill: Callable[[str], None]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        fill(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
