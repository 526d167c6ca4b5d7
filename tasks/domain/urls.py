"""Paths and URLs of storage locations: expand, join, mask for printing. Runs anywhere.

Example::

    expand_path("~/runs")                     # "/home/me/runs"
    join_url("s3://bucket/runs", "datasets")  # "s3://bucket/runs/datasets"
    mask_url("https://user:pw@host/f?token=x")  # "https://***@host/f?***"
"""

from __future__ import annotations

import os
import urllib.parse


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


def mask_url(url: str) -> str:
    """``url`` with user, password and query string masked, safe to print or log."""
    if not is_url(url):
        return url
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc and not parts.query:
        return url  # nothing to hide (and sqlite:////abs/path keeps its slashes)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))
