"""Fetching a data set's files from mirrors into a local cache, md5-verified. Runs on the driver and workers.

The pipeline's download step fetches from the official mirrors (or ``TRAINLIB_DATA_MIRRORS``);
every worker node then fetches the staged copy from run storage into its own cache with the
same call, checked against the same md5s. The cache never holds a partial or wrong file.

Example::

    files = fetch_dataset("fashion-mnist", "~/.trainlib/datasets", mirrors=["/data/fashion-mnist"])
    files.paths["t10k-images-idx3-ubyte.gz"]
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from tasks.domain.credentials import MIRROR_CREDENTIALS_ENV_VAR
from tasks.domain.dataset_registry import DatasetSpec, get_dataset_spec
from tasks.domain.file_copy import copy_to_file, md5_file
from tasks.domain.urls import expand_path, is_url, mask_url
from trainlib.errors import describe_error, is_transient, with_retries
from trainlib.masking import redact_text

logger = logging.getLogger("trainlib")

MIRRORS_ENV_VAR = "TRAINLIB_DATA_MIRRORS"
DEFAULT_TIMEOUT_S = 60.0  # per socket operation of one HTTP download
DEFAULT_ATTEMPTS = 3  # tries per mirror on transient errors
DEFAULT_BACKOFF_S = 1.0  # about the wait before the 2nd try; doubles for each further one
# The most one data-set file may take when its size is not announced (no Content-Length): a mirror that streams
# without end stops here instead of filling the disk. The largest known file (FashionMNIST's training images) is 26 MB.
DEFAULT_MAX_FILE_BYTES = 1 << 30


class DatasetDownloadError(RuntimeError):
    """A data-set file could not be fetched or staged.

    Attributes:
        dataset: the data set's name.
        filename: the file that failed.
        attempts: ``(url, error)`` for every URL tried, in order; URLs have any
            user, password or query string masked.

    Picklable: every argument is a plain string or a tuple of them.
    """

    def __init__(self, message: str, dataset: str = "", filename: str = "", attempts: Iterable[tuple[str, str]] = ()):
        self.message = message
        self.dataset = dataset
        self.filename = filename
        self.attempts = tuple(tuple(a) for a in attempts)
        super().__init__(message, dataset, filename, self.attempts)

    def __str__(self) -> str:
        return self.message


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


def fetch_dataset(
    name: str,
    cache_dir: str | os.PathLike,
    mirrors: Iterable[str] | str | None = None,
    *,
    md5s: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    attempts_per_mirror: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
    storage_options: Mapping[str, Any] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
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
            (connection refused or reset, timeouts, HTTP 5xx/429), as :func:`trainlib.errors.is_transient`
            decides.
        backoff_s: about the wait before the second try (jittered); doubles for each further one.
        storage_options: passed to fsspec for fsspec mirrors (e.g. an S3 endpoint).
        max_file_bytes: the most one file may take; a download stops at its announced size (Content-Length) or
            at this bound, whichever is smaller, and that mirror fails with the reason.

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

    folder = os.path.join(expand_path(cache_dir), spec.name)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DatasetDownloadError(
            f"Cannot create the data-set cache folder {folder!r}: {exc}. Pass a writable cache_dir.", dataset=spec.name
        ) from None

    fetcher = _Fetcher(
        spec.name,
        folder,
        mirror_list,
        timeout_s,
        attempts_per_mirror,
        backoff_s,
        dict(storage_options or {}),
        max_file_bytes,
    )
    _sweep_dead_parts(folder)
    paths, downloaded, cached, sources = {}, [], [], {}
    for filename, md5 in expected.items():
        path = os.path.join(folder, filename)
        paths[filename] = path
        if os.path.isfile(path):
            actual = md5_file(path)
            if actual == md5:
                cached.append(filename)
                continue
            logger.warning("Cached %s has md5 %s, expected %s; downloading it again.", path, actual, md5)
        sources[filename] = fetcher.fetch(filename, md5, path)
        downloaded.append(filename)
    logger.info("Data set %s in %s: %d file(s) downloaded, %d cached.", spec.name, folder, len(downloaded), len(cached))
    return DatasetFiles(
        name=spec.name,
        folder=folder,
        paths=paths,
        md5s=dict(expected),
        downloaded=tuple(downloaded),
        cached=tuple(cached),
        sources=sources,
    )


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
        raise ValueError(
            f"mirrors={mirrors!r} holds no mirror. Pass base URLs or local folders, or None for the official mirrors."
        )
    return result


def _file_url(mirror: str, filename: str) -> str:
    if is_url(mirror):
        return mirror.rstrip("/") + "/" + filename
    return os.path.join(expand_path(mirror), filename)


class _Fetcher:
    """Fetches files of one data set from its mirrors; remembers mirrors found down."""

    def __init__(
        self,
        dataset: str,
        folder: str,
        mirrors: list[str],
        timeout_s: float,
        attempts: int,
        backoff_s: float,
        storage_options: dict[str, Any],
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ):
        self.max_file_bytes = max_file_bytes
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
            shown = mask_url(url)
            if mirror in self.down:
                tried.append((shown, f"skipped, unreachable earlier in this call: {self.down[mirror]}"))
                continue
            # The pid in the name: a killed fetch's file is swept by the next fetch (_sweep_dead_parts).
            tmp = os.path.join(self.folder, f".{filename}.{os.getpid()}-{uuid.uuid4().hex}.part")
            try:
                actual, error, transient = self._download(url, tmp)
                if error is not None:
                    tried.append((shown, error))
                    if transient:
                        self.down[mirror] = error
                    logger.warning("Could not fetch %s from %s (%s); trying the next mirror.", filename, shown, error)
                    continue
                if actual != md5:
                    mismatches += 1
                    tried.append((shown, f"checksum mismatch for {filename}: expected md5 {md5}, got {actual}"))
                    logger.warning(
                        "%s from %s: expected md5 %s, got %s; trying the next mirror.", filename, shown, md5, actual
                    )
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
            advice.append(
                f"Check the network (proxy, firewall) and the URLs, or pass mirrors=[...] or set "
                f"{MIRRORS_ENV_VAR} to reachable mirrors; a local folder holding the files works "
                "as a mirror."
            )
        if mismatches:
            advice.append(
                "A checksum mismatch means the mirror serves a different or corrupt file: fix or "
                "drop that mirror, or, for generated or staged data, pass md5s= with the right "
                "checksums."
            )
        raise DatasetDownloadError(
            f"Could not fetch {filename} of data set {self.dataset!r} with md5 {md5} from any of "
            f"{len(tried)} mirror(s):\n{lines}\n" + "\n".join(advice),
            dataset=self.dataset,
            filename=filename,
            attempts=tried,
        )

    def _download(self, url: str, tmp: str) -> tuple[str | None, str | None, bool]:
        """Copy ``url`` to ``tmp``, retrying transient errors: ``(md5, error, error_was_transient)``."""
        tries = 0

        def copy() -> str:
            nonlocal tries
            tries += 1
            return copy_to_file(url, tmp, self.timeout_s, self.storage_options, self.max_file_bytes)

        try:
            return (
                with_retries(
                    f"Fetching {mask_url(url)}",
                    copy,
                    attempts=self.attempts,
                    base_delay_s=self.backoff_s,
                    max_delay_s=math.inf,
                    error=None,
                ),
                None,
                False,
            )
        except Exception as exc:  # noqa: BLE001 - reported with every other mirror's error
            error = _masked_error(describe_error(exc), url)
            if getattr(exc, "code", None) in (401, 403):
                error += (
                    " (the mirror refused access: give its credentials in the mirror URL, "
                    "http://user:password@host/path/, or in $" + MIRROR_CREDENTIALS_ENV_VAR + ")"
                )
            if not is_transient(exc):
                return None, error, False
            return None, f"{error} (after {tries} attempt(s))", True


def _masked_error(text: str, url: str) -> str:
    """``text`` with ``url`` (and the URL without its credentials) masked, wherever it appears."""
    return redact_text(text.replace(url, mask_url(url)))


def _sweep_dead_parts(folder: str) -> None:
    """Remove the temporary files of fetches whose process is gone (killed mid-download)."""
    for name in os.listdir(folder):
        if not (name.startswith(".") and name.endswith(".part")):
            continue
        try:
            pid = int(name[: -len(".part")].rsplit(".", 1)[1].split("-", 1)[0])
        except (IndexError, ValueError):
            continue  # not ours
        try:
            os.kill(pid, 0)
            continue  # still fetching
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.remove(os.path.join(folder, name))
        except FileNotFoundError:
            pass


def is_transient_download_failure(exc: BaseException | None) -> bool:
    """True when every mirror failed for a network reason (worth retrying later).

    A checksum mismatch, an unknown data set, a missing local file or any other
    error is permanent: retrying would only delay the message.
    """
    if not isinstance(exc, DatasetDownloadError) or not exc.attempts:
        return False
    # fetch_dataset marks a mirror that stayed unreachable through its retries with
    # "(after N attempt(s))", and later files skip it as "unreachable earlier".
    return all(error.endswith("attempt(s))") or error.startswith("skipped, unreachable") for _, error in exc.attempts)
