"""Data sets for the pipeline: download, verify, stage to run storage, read.

Where it runs:

* on the driver, in the pipeline's data step: ``fetch_dataset`` downloads each
  file once into a local cache (md5-verified) and ``stage_dataset`` copies the
  verified files to run storage (a shared folder or ``s3://``);
* on every worker node: ``fetch_dataset(name, node_cache, mirrors=[staged_url],
  md5s=files.md5s)`` pulls the staged copy into a node-local cache, verified
  again, and ``load_fashion_mnist_split`` / ``torchvision_layout`` read it.

Plain functions with no Prefect import; the pipeline wraps them in tasks.
``write_idx_dataset`` writes tiny generated data in the same idx format for tests
and CI, which have no internet.

Example::

    files = fetch_dataset("fashion-mnist", "~/.cache/trainlib/datasets")
    url = stage_dataset(files, "s3://my-bucket/datasets")
    images, labels = load_fashion_mnist_split(files.folder, train=False)
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import http.client
import logging
import math
import os
import posixpath
import shutil
import socket
import ssl
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Callable, TypeVar

import fsspec
import torch

__all__ = [
    "DATASETS",
    "MIRRORS_ENV_VAR",
    "DatasetDownloadError",
    "DatasetFiles",
    "DatasetSpec",
    "fetch_dataset",
    "get_dataset_spec",
    "load_fashion_mnist_split",
    "stage_dataset",
    "torchvision_layout",
    "write_idx_dataset",
]

logger = logging.getLogger("trainlib")

T = TypeVar("T")

# Tunables of this module, in one place.
MIRRORS_ENV_VAR = "TRAINLIB_DATA_MIRRORS"
DEFAULT_TIMEOUT_S = 60.0          # per socket operation of one HTTP download
DEFAULT_ATTEMPTS_PER_MIRROR = 3   # transient network errors are retried this often per mirror
DEFAULT_BACKOFF_S = 1.0           # wait before the 2nd attempt; doubles for each further one
_CHUNK = 1 << 20

# The four files of (Fashion-)MNIST and the idx magic numbers of their contents.
_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
_SPLIT_FILES = {
    True: ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    False: ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class DatasetDownloadError(RuntimeError):
    """A data-set file could not be fetched or staged.

    Attributes:
        dataset: the data set's name.
        filename: the file that failed.
        attempts: ``(url, error)`` for every URL tried, in order; URLs have any
            user, password or query string masked.

    Picklable: every argument is a plain string or a tuple of them.
    """

    def __init__(self, message: str, dataset: str = "", filename: str = "",
                 attempts: Iterable[tuple[str, str]] = ()):
        self.message = message
        self.dataset = dataset
        self.filename = filename
        self.attempts = tuple(tuple(a) for a in attempts)
        super().__init__(message, dataset, filename, self.attempts)

    def __str__(self) -> str:
        return self.message


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A known data set: its files with their md5s, and its official mirrors.

    Attributes:
        name: registry key, e.g. ``"fashion-mnist"``.
        files: ``(filename, md5)`` pairs.
        mirrors: base URLs; a file's URL is ``mirror + filename``.
    """

    name: str
    files: tuple[tuple[str, str], ...]
    mirrors: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DatasetFiles:
    """The verified local copy of a data set, as returned by :func:`fetch_dataset`.

    Attributes:
        name: the data set's name.
        folder: the local folder holding the files.
        paths: filename -> local path.
        md5s: filename -> md5 that each file was verified against.
        downloaded: files fetched from a mirror by this call.
        cached: files already in the cache with the right md5 (not downloaded).
        sources: filename -> URL each downloaded file came from (masked).
    """

    name: str
    folder: str
    paths: dict[str, str]
    md5s: dict[str, str]
    downloaded: tuple[str, ...]
    cached: tuple[str, ...]
    sources: dict[str, str]


_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({
    "fashion-mnist": DatasetSpec(
        name="fashion-mnist",
        files=tuple(zip(_MNIST_FILES, (
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
            "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"))),
        mirrors=("https://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                 "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"),
    ),
    # torchvision.datasets.MNIST's mirrors and md5s.
    "mnist": DatasetSpec(
        name="mnist",
        files=tuple(zip(_MNIST_FILES, (
            "f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"))),
        mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "http://yann.lecun.com/exdb/mnist/"),
    ),
})


def get_dataset_spec(name: str) -> DatasetSpec:
    """Return the registry entry of data set ``name``.

    Raises:
        ValueError: ``name`` is not a known data set; the message lists the known ones.

    Example::

        get_dataset_spec("fashion-mnist").mirrors
    """
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(n) for n in sorted(DATASETS))
        raise ValueError(f"Unknown data set {name!r}. Known data sets: {known}.") from None


# -- fetching ----------------------------------------------------------------------


def fetch_dataset(
    name: str,
    cache_dir: str | os.PathLike,
    mirrors: Iterable[str] | str | None = None,
    *,
    md5s: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    attempts_per_mirror: int = DEFAULT_ATTEMPTS_PER_MIRROR,
    backoff_s: float = DEFAULT_BACKOFF_S,
    storage_options: Mapping[str, Any] | None = None,
) -> DatasetFiles:
    """Make every file of data set ``name`` present and md5-verified in ``cache_dir/name/``.

    A file already in the cache with the right md5 is not downloaded again. Any
    other file is fetched from the mirrors in order, into a temporary name in the
    cache, and renamed only once its md5 matches, so the cache never holds a
    partial or wrong file (several processes may fetch into one cache at once).

    Args:
        name: a key of :data:`DATASETS`, e.g. ``"fashion-mnist"``.
        cache_dir: local folder; files go to ``cache_dir/name/``.
        mirrors: base URLs tried in order: ``http(s)://`` (urllib), ``file://``, a
            local folder path, or any fsspec URL such as ``s3://bucket/prefix``. A
            string is split at commas. Default: the comma-separated list in the
            ``TRAINLIB_DATA_MIRRORS`` environment variable, else the official mirrors.
        md5s: filename -> md5 replacing the registry's checksums, for data written
            by :func:`write_idx_dataset` or staged copies (pass ``files.md5s``).
        timeout_s: socket timeout of each HTTP request.
        attempts_per_mirror: tries per mirror on transient network errors
            (connection refused or reset, timeouts, HTTP 5xx/429).
        backoff_s: wait before the second try; doubles for each further one.
        storage_options: passed to fsspec for fsspec mirrors (e.g. an S3 endpoint).

    Returns:
        The :class:`DatasetFiles`, with which files were downloaded and which cached.

    Raises:
        ValueError: unknown ``name`` or bad arguments.
        DatasetDownloadError: a file matched its md5 on no mirror; the message lists
            every URL tried with its error (a checksum mismatch names the file, the
            expected and the actual md5).

    Example::

        files = fetch_dataset("fashion-mnist", "/tmp/cache", mirrors=["/data/fashion-mnist"])
        files.paths["t10k-images-idx3-ubyte.gz"]
    """
    spec = get_dataset_spec(name)
    expected = _expected_md5s(spec, md5s)
    mirror_list = _resolve_mirrors(spec, mirrors)
    if not isinstance(attempts_per_mirror, int) or attempts_per_mirror < 1:
        raise ValueError(f"attempts_per_mirror={attempts_per_mirror!r} must be an int >= 1.")
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be > 0 seconds.")
    if backoff_s < 0:
        raise ValueError(f"backoff_s={backoff_s!r} must be >= 0 seconds.")

    folder = os.path.join(os.path.abspath(os.path.expanduser(os.fspath(cache_dir))), spec.name)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DatasetDownloadError(
            f"Cannot create the data-set cache folder {folder!r}: {exc}. Pass a writable cache_dir.",
            dataset=spec.name) from None

    fetcher = _Fetcher(spec.name, folder, mirror_list, timeout_s, attempts_per_mirror, backoff_s,
                       dict(storage_options or {}))
    paths, downloaded, cached, sources = {}, [], [], {}
    for filename, md5 in expected.items():
        path = os.path.join(folder, filename)
        paths[filename] = path
        if os.path.isfile(path):
            actual = _md5_file(path)
            if actual == md5:
                cached.append(filename)
                continue
            logger.warning("Cached %s has md5 %s, expected %s; downloading it again.", path, actual, md5)
        sources[filename] = fetcher.fetch(filename, md5, path)
        downloaded.append(filename)
    logger.info("Data set %s in %s: %d file(s) downloaded, %d cached.", spec.name, folder,
                len(downloaded), len(cached))
    return DatasetFiles(name=spec.name, folder=folder, paths=paths, md5s=dict(expected),
                        downloaded=tuple(downloaded), cached=tuple(cached), sources=sources)


def _expected_md5s(spec: DatasetSpec, md5s: Mapping[str, str] | None) -> dict[str, str]:
    if md5s is None:
        return dict(spec.files)
    known = [f for f, _ in spec.files]
    if set(md5s) != set(known):
        raise ValueError(f"md5s must give exactly the files of {spec.name!r}: {known}; got {sorted(md5s)}.")
    for filename, md5 in md5s.items():
        if not (isinstance(md5, str) and len(md5) == 32 and all(c in "0123456789abcdef" for c in md5.lower())):
            raise ValueError(f"md5s[{filename!r}]={md5!r} is not an md5 (32 hex digits).")
    return {f: md5s[f].lower() for f in known}


def _resolve_mirrors(spec: DatasetSpec, mirrors: Iterable[str] | str | None) -> list[str]:
    if mirrors is None:
        env = os.environ.get(MIRRORS_ENV_VAR, "")
        mirrors = env if env.strip() else list(spec.mirrors)
    if isinstance(mirrors, (str, os.PathLike)):
        mirrors = os.fspath(mirrors).split(",")
    result = [os.fspath(m).strip() for m in mirrors if os.fspath(m).strip()]
    if not result:
        raise ValueError(f"mirrors={mirrors!r} holds no mirror. Pass base URLs or local folders, or None "
                         "for the official mirrors.")
    return result


def _file_url(mirror: str, filename: str) -> str:
    if "://" in mirror:
        return mirror.rstrip("/") + "/" + filename
    return os.path.join(os.path.abspath(os.path.expanduser(mirror)), filename)


def _mask(url: str) -> str:
    """``url`` with user, password and query string masked, safe to print."""
    if "://" not in url:
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class _Fetcher:
    """Fetches files of one data set from its mirrors; remembers mirrors found down."""

    def __init__(self, dataset: str, folder: str, mirrors: list[str], timeout_s: float,
                 attempts: int, backoff_s: float, storage_options: dict[str, Any]):
        self.dataset = dataset
        self.folder = folder
        self.mirrors = mirrors
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.storage_options = storage_options
        # A mirror that stayed unreachable through every retry is skipped for the
        # remaining files of this call, so one dead mirror costs its retries once.
        self.down: dict[str, str] = {}

    def fetch(self, filename: str, md5: str, dest: str) -> str:
        tried: list[tuple[str, str]] = []
        mismatches = 0
        for mirror in self.mirrors:
            url = _file_url(mirror, filename)
            shown = _mask(url)
            if mirror in self.down:
                tried.append((shown, f"skipped, unreachable earlier in this call: {self.down[mirror]}"))
                continue
            tmp = os.path.join(self.folder, f".{filename}.{uuid.uuid4().hex}.part")
            try:
                actual, error, transient = self._download(url, tmp)
                if error is not None:
                    tried.append((shown, error))
                    if transient:
                        self.down[mirror] = error
                    continue
                if actual != md5:
                    mismatches += 1
                    tried.append((shown, f"checksum mismatch for {filename}: expected md5 {md5}, "
                                         f"got {actual}"))
                    logger.warning("%s from %s: expected md5 %s, got %s; trying the next mirror.",
                                   filename, shown, md5, actual)
                    continue
                os.replace(tmp, dest)
                logger.info("Downloaded %s from %s (md5 ok).", filename, shown)
                return shown
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        lines = "\n".join(f"  - {url}: {error}" for url, error in tried)
        advice = []
        if mismatches < len(tried):
            advice.append(f"Check the network (proxy, firewall) and the URLs, or pass mirrors=[...] or set "
                          f"{MIRRORS_ENV_VAR} to reachable mirrors; a local folder holding the files works "
                          "as a mirror.")
        if mismatches:
            advice.append("A checksum mismatch means the mirror serves a different or corrupt file: fix or "
                          "drop that mirror, or, for generated or staged data, pass md5s= with the right "
                          "checksums.")
        raise DatasetDownloadError(
            f"Could not fetch {filename} of data set {self.dataset!r} with md5 {md5} from any of "
            f"{len(tried)} mirror(s):\n{lines}\n" + "\n".join(advice),
            dataset=self.dataset, filename=filename, attempts=tried)

    def _download(self, url: str, tmp: str) -> tuple[str | None, str | None, bool]:
        """Copy ``url`` to ``tmp``, retrying transient errors: ``(md5, error, error_was_transient)``."""
        for attempt in range(1, self.attempts + 1):
            try:
                return _copy_to(url, tmp, self.timeout_s, self.storage_options), None, False
            except Exception as exc:  # noqa: BLE001 - classified and reported below
                transient = _is_transient(exc)
                error = _describe(exc).replace(url, _mask(url))
                if not transient:
                    return None, error, False
                if attempt == self.attempts:
                    return None, f"{error} (after {attempt} attempt(s))", True
                delay = self.backoff_s * 2 ** (attempt - 1)
                logger.warning("Fetching %s failed (%s); retrying in %.1fs (attempt %d of %d).",
                               _mask(url), error, delay, attempt, self.attempts)
                time.sleep(delay)
        raise AssertionError("unreachable")


def _copy_to(url: str, tmp: str, timeout_s: float, storage_options: dict[str, Any]) -> str:
    """Stream ``url`` into the file ``tmp``; return the md5 of what was written."""
    scheme = urllib.parse.urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in ("http", "https"):
        request = urllib.request.Request(url, headers={"User-Agent": "trainlib"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            length = response.headers.get("Content-Length")
            md5, size = _stream(response, tmp)
            if length is not None and size != int(length):
                raise http.client.IncompleteRead(b"", int(length) - size)
            return md5
    if scheme == "file":
        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        with open(path, "rb") as src:
            return _stream(src, tmp)[0]
    if scheme == "":
        with open(url, "rb") as src:
            return _stream(src, tmp)[0]
    with fsspec.open(url, "rb", **storage_options) as src:
        return _stream(src, tmp)[0]


def _stream(src: Any, tmp: str) -> tuple[str, int]:
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    with open(tmp, "wb") as out:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _md5_file(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _is_transient(exc: BaseException) -> bool:
    """Whether retrying the same URL may help (network blips), as opposed to 404s and bad URLs."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else None
        if exc is None:
            return False
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN  # "temporary failure in name resolution"
    if isinstance(exc, (ssl.SSLCertVerificationError, FileNotFoundError, PermissionError,
                        IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (http.client.HTTPException, TimeoutError, ConnectionError, OSError)):
        return True
    return type(exc).__module__.startswith(("botocore", "aiobotocore", "urllib3", "aiohttp"))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    if isinstance(exc, http.client.IncompleteRead):
        return f"connection closed early, {exc.expected} byte(s) missing"
    return f"{type(exc).__name__}: {exc}"


# -- staging -----------------------------------------------------------------------


def stage_dataset(files: DatasetFiles, storage_url: str | os.PathLike,
                  storage_options: Mapping[str, Any] | None = None) -> str:
    """Copy the verified files of ``files`` to ``<storage_url>/<name>/`` so every node reads them.

    A file already there with the same size is skipped. Local files are written
    under a temporary name and renamed; object stores put each file whole.

    Args:
        files: what :func:`fetch_dataset` returned.
        storage_url: a local or shared folder, or an fsspec URL such as ``s3://bucket/datasets``.
        storage_options: passed to fsspec (credentials, ``client_kwargs={"endpoint_url": ...}``);
            never printed.

    Returns:
        The staged folder (a local path, or a URL), to use as a mirror on workers:
        ``fetch_dataset(files.name, node_cache, mirrors=[url], md5s=files.md5s)``.

    Raises:
        DatasetDownloadError: the storage could not be written (after retries for
            transient errors); the message says which file and why.

    Example::

        url = stage_dataset(files, "s3://my-bucket/datasets")  # "s3://my-bucket/datasets/fashion-mnist"
    """
    base = os.fspath(storage_url)
    if "://" not in base:
        base = os.path.abspath(os.path.expanduser(base))
    staged_url = base.rstrip("/") + "/" + files.name
    shown = _mask(staged_url)
    try:
        fs, root = fsspec.core.url_to_fs(staged_url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise DatasetDownloadError(
            f"Cannot open storage {shown}: {type(exc).__name__}: {exc}. Use a local folder or an fsspec URL "
            "whose package is installed (s3:// needs s3fs).", dataset=files.name) from None
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    local = protocol in ("file", "local")

    uploaded, skipped = [], []
    for filename, path in files.paths.items():
        size = os.path.getsize(path)
        dest = posixpath.join(root, filename)
        what = f"Staging {filename} of {files.name!r} to {shown}"
        try:
            fs.invalidate_cache(root)
            try:
                if fs.info(dest).get("size") == size:
                    skipped.append(filename)
                    continue
            except FileNotFoundError:
                pass
            _retry(what, lambda: _put(fs, path, dest, local))
            if fs.info(dest).get("size") != size:
                raise OSError(f"{dest} has size {fs.info(dest).get('size')} after upload, expected {size}")
        except Exception as exc:  # noqa: BLE001 - reported with what to do
            raise DatasetDownloadError(
                f"{what} failed: {type(exc).__name__}: {exc}. Check storage_url (bucket name, path) and "
                "storage_options (credentials, endpoint), and that the storage is writable.",
                dataset=files.name, filename=filename, attempts=[(shown, f"{type(exc).__name__}: {exc}")],
            ) from None
        uploaded.append(filename)
    logger.info("Staged %s to %s: uploaded %s, skipped (already there) %s.", files.name, shown,
                uploaded or "none", skipped or "none")
    return staged_url


def _put(fs: fsspec.AbstractFileSystem, path: str, dest: str, local: bool) -> None:
    if not local:
        fs.put_file(path, dest)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.{uuid.uuid4().hex}.part"
    try:
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _retry(what: str, func: Callable[[], T]) -> T:
    delay = DEFAULT_BACKOFF_S
    for attempt in range(1, DEFAULT_ATTEMPTS_PER_MIRROR + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not _is_transient(exc) or attempt == DEFAULT_ATTEMPTS_PER_MIRROR:
                raise
            logger.warning("%s failed (%s); retrying in %.1fs (attempt %d of %d).", what,
                           _describe(exc), delay, attempt, DEFAULT_ATTEMPTS_PER_MIRROR)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


# -- reading -----------------------------------------------------------------------


def load_fashion_mnist_split(folder: str | os.PathLike, train: bool,
                             limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    images_name, labels_name = _SPLIT_FILES[bool(train)]
    images_dims, images_data = _read_idx(_find_file(folder, images_name), _IMAGES_MAGIC, limit)
    labels_dims, labels_data = _read_idx(_find_file(folder, labels_name), _LABELS_MAGIC, limit)
    if images_dims[0] != labels_dims[0]:
        raise ValueError(f"{folder}: {images_name} holds {images_dims[0]} images but {labels_name} "
                         f"{labels_dims[0]} labels; the files are from different data sets. Fetch them again.")
    n = len(labels_data)
    images = torch.frombuffer(bytearray(images_data), dtype=torch.uint8).view(n, *images_dims[1:])
    labels = torch.frombuffer(bytearray(labels_data), dtype=torch.uint8).to(torch.int64)
    return images, labels


def _find_file(folder: str | os.PathLike, gz_name: str) -> str:
    for candidate in (gz_name, gz_name[: -len(".gz")]):
        path = os.path.join(os.fspath(folder), candidate)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{gz_name} (or its decompressed form) is not in {os.fspath(folder)!r}. "
                            "Run fetch_dataset first and pass its .folder.")


def _check_magic(path: str, head: bytes, magic: int) -> int:
    """Validate an idx header's magic number; return the number of dimensions."""
    if len(head) < 4 or struct.unpack(">I", head[:4])[0] != magic:
        got = f"0x{struct.unpack('>I', head[:4])[0]:08x}" if len(head) >= 4 else f"{len(head)} byte(s)"
        kind = "image" if magic == _IMAGES_MAGIC else "label"
        raise ValueError(f"{path} is not an idx {kind} file: magic number {got}, expected 0x{magic:08x}. "
                         "The file is corrupt or of another data set; delete it and run fetch_dataset "
                         "again (it checks md5s).")
    return magic & 0xFF


def _read_idx(path: str, magic: int, limit: int | None) -> tuple[tuple[int, ...], bytes]:
    """Return the dimensions (first one cut to ``limit``) and the data bytes of an idx file."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            ndim = _check_magic(path, f.read(4), magic)
            raw_dims = f.read(4 * ndim)
            if len(raw_dims) != 4 * ndim:
                raise ValueError("the header is truncated")
            dims = struct.unpack(f">{ndim}I", raw_dims)
            count = dims[0] if limit is None else min(dims[0], limit)
            want = count * math.prod(dims[1:])
            data = f.read(want)
            if len(data) != want:
                raise ValueError(f"the header says {dims[0]} items of shape {list(dims[1:])} but the data "
                                 "ends early")
            # Reading to the end also makes gzip check the file's CRC.
            if count == dims[0] and f.read(1):
                raise ValueError("there are bytes after the data the header announces")
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(path):
            raise
        raise ValueError(f"{path} is corrupt ({type(exc).__name__}: {exc}). Delete it and run "
                         "fetch_dataset again (it checks md5s).") from None
    return (count, *dims[1:]), data


def torchvision_layout(folder: str | os.PathLike, root: str | os.PathLike,
                       dataset_class: str = "FashionMNIST") -> str:
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
        for gz_name, magic in zip(_SPLIT_FILES[train], (_IMAGES_MAGIC, _LABELS_MAGIC)):
            src = _find_file(folder, gz_name)
            dest = os.path.join(raw, gz_name[: -len(".gz")])
            compressed = src.endswith(".gz")
            size = _gzip_size(src) if compressed else os.path.getsize(src)
            if os.path.isfile(dest) and os.path.getsize(dest) % (1 << 32) == size:
                continue
            tmp = f"{dest}.{uuid.uuid4().hex}.part"
            try:
                with (gzip.open if compressed else open)(src, "rb") as f, open(tmp, "wb") as out:
                    head = f.read(4)
                    _check_magic(src, head, magic)
                    out.write(head)
                    shutil.copyfileobj(f, out, _CHUNK)
                os.replace(tmp, dest)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(f"{src} is corrupt ({type(exc).__name__}: {exc}). Delete it and run "
                                 "fetch_dataset again (it checks md5s).") from None
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


# -- generated data ----------------------------------------------------------------


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
        images_name, labels_name = _SPLIT_FILES[train]
        payloads = {
            images_name: struct.pack(">IIII", _IMAGES_MAGIC, n, 28, 28) + images.numpy().tobytes(),
            labels_name: struct.pack(">II", _LABELS_MAGIC, n) + labels.to(torch.uint8).numpy().tobytes(),
        }
        for name, payload in payloads.items():
            data = gzip.compress(payload, mtime=0)  # mtime=0: same bytes, same md5 every time
            path = os.path.join(folder, name)
            tmp = f"{path}.{uuid.uuid4().hex}.part"
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
            md5s[name] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    return {name: md5s[name] for name in _MNIST_FILES}
