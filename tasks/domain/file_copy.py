"""One file copied from a URL (HTTP, ``file://``, any fsspec store) or a local path into a local file, with its
MD5 computed on the way. Runs wherever a dataset is fetched (a Ray task worker, the CLI)."""

from __future__ import annotations

import hashlib
import http.client
import urllib.parse
import urllib.request
from typing import Any

import fsspec

from tasks.domain.credentials import mirror_authorization
from tasks.domain.urls import is_url
from trainlib.masking import split_credentials

CHUNK_BYTES = 1 << 20


def copy_to_file(url: str, tmp: str, timeout_s: float, storage_options: dict[str, Any], max_bytes: int) -> str:
    """Stream ``url`` into the file ``tmp``; return the md5 of what was written.

    Raises:
        DownloadTooLargeError: more bytes came than announced (Content-Length) or than ``max_bytes``.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower() if is_url(url) else ""
    if scheme in ("http", "https"):
        # Basic auth from the URL's own user-info (never sent as part of the host name) or from the credentials
        # the command moved out of the flow run's parameters (tasks.domain.credentials).
        headers = {"User-Agent": "trainlib"}
        authorization = mirror_authorization(url)
        if authorization is not None:
            headers["Authorization"] = authorization
        request = urllib.request.Request(split_credentials(url).url, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            announced = int(length) if length is not None and length.isdigit() else None
            md5, size = stream_to_file(response, tmp, min(max_bytes, announced) if announced is not None else max_bytes)
            if announced is not None and size != announced:
                raise http.client.IncompleteRead(b"", announced - size)
            return md5
    if scheme == "file":
        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        with open(path, "rb") as src:
            return stream_to_file(src, tmp, max_bytes)[0]
    if scheme == "":
        with open(url, "rb") as src:
            return stream_to_file(src, tmp, max_bytes)[0]
    with fsspec.open(url, "rb", **storage_options) as src:
        return stream_to_file(src, tmp, max_bytes)[0]


class DownloadTooLargeError(ValueError):
    """A mirror sent more than the file's announced size or the bound: stopped (not retried)."""


def stream_to_file(src: Any, tmp: str, limit: int) -> tuple[str, int]:
    """Copy the readable ``src`` into the file ``tmp``, at most ``limit`` bytes; return the md5 and the size.

    Raises:
        DownloadTooLargeError: ``src`` holds more than ``limit`` bytes.
    """
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    with open(tmp, "wb") as out:
        while chunk := src.read(min(CHUNK_BYTES, limit - size + 1)):
            size += len(chunk)
            if size > limit:
                raise DownloadTooLargeError(
                    f"the mirror sent more than {limit} bytes ({limit / 2**20:.1f} MiB, its announced size or "
                    "max_file_bytes): stopped. A mirror that streams without end is broken or is not a data-set "
                    "mirror; if the file really is that big, pass a larger max_file_bytes."
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), size


def md5_file(path: str) -> str:
    """The md5 of a local file, as 32 hex digits."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
