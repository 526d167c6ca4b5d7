"""One file copied from a URL (HTTP, ``file://``, any fsspec store) or a local path into a local file, with its
MD5 computed on the way. Runs wherever a dataset is fetched (a Ray task worker, the CLI)."""

from __future__ import annotations

import hashlib
import http.client
import urllib.parse
import urllib.request
from typing import Any

import fsspec

from tasks.domain.urls import is_url

CHUNK_BYTES = 1 << 20


def copy_to_file(url: str, tmp: str, timeout_s: float, storage_options: dict[str, Any]) -> str:
    """Stream ``url`` into the file ``tmp``; return the md5 of what was written."""
    scheme = urllib.parse.urlsplit(url).scheme.lower() if is_url(url) else ""
    if scheme in ("http", "https"):
        request = urllib.request.Request(url, headers={"User-Agent": "trainlib"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            md5, size = stream_to_file(response, tmp)
            if length is not None and size != int(length):
                raise http.client.IncompleteRead(b"", int(length) - size)
            return md5
    if scheme == "file":
        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        with open(path, "rb") as src:
            return stream_to_file(src, tmp)[0]
    if scheme == "":
        with open(url, "rb") as src:
            return stream_to_file(src, tmp)[0]
    with fsspec.open(url, "rb", **storage_options) as src:
        return stream_to_file(src, tmp)[0]


def stream_to_file(src: Any, tmp: str) -> tuple[str, int]:
    """Copy the readable ``src`` into the file ``tmp``; return the md5 and the size of what was written."""
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    with open(tmp, "wb") as out:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def md5_file(path: str) -> str:
    """The md5 of a local file, as 32 hex digits."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
