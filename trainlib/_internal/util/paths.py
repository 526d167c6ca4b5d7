"""Path expansion: ``~`` and relative local paths to absolute ones; URLs left as they are. Driver and workers."""

from __future__ import annotations

import os


def is_url(path: str) -> bool:
    return "://" in path


def expand_path(path: str | os.PathLike) -> str:
    """``path`` with ``~`` expanded and made absolute; a URL (``s3://...``, ``file://...``) unchanged."""
    path = os.fspath(path)
    if is_url(path):
        return path
    return os.path.abspath(os.path.expanduser(path))
