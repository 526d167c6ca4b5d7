"""Paths and URLs of storage locations: expand, join, mask for printing. Runs anywhere.

Example::

    expand_path("~/runs")                     # "/home/me/runs"
    join_url("s3://bucket/runs", "datasets")  # "s3://bucket/runs/datasets"
    mask_url("https://user:p#w@host/f?token=x")  # "https://user:[REDACTED]@host/f?token=[REDACTED]"

``mask_url`` is trainlib's one masking helper (:func:`trainlib.masking.redact_url`), under the name the
pipeline's modules use.
"""

from __future__ import annotations

import os

from trainlib.masking import redact_url as mask_url

__all__ = ["expand_path", "is_url", "join_url", "mask_url"]


def is_url(location: str | os.PathLike) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return "://" in os.fspath(location)


def expand_path(location: str | os.PathLike) -> str:
    """A local path made absolute with ``~`` expanded; URLs are returned as they are."""
    text = os.fspath(location)
    return text if is_url(text) else os.path.abspath(os.path.expanduser(text))


def join_url(base: str, name: str) -> str:
    """``base/name`` for a local folder or a URL (always a ``/``, never a doubled one)."""
    return base.rstrip("/") + "/" + name
