"""Fetching one data-set file from its mirrors in turn: retries, md5 check, temporary files, the error listing them.

Runs wherever :func:`tasks.domain.dataset_fetch.fetch_dataset` runs: the pipeline's download step (the
official mirrors or ``TRAINLIB_DATA_MIRRORS``) and every worker node fetching the staged copy into its own
cache. :class:`MirrorFetcher` copies a file to a temporary name beside its destination, retries transient
network errors, renames it only once its md5 matches, and remembers a mirror that stayed down; when no
mirror served the file, :class:`DatasetDownloadError` names every URL tried with its error (credentials
masked), and :func:`is_transient_download_failure` says whether retrying later may help.

Example::

    fetcher = MirrorFetcher("fashion-mnist", folder, resolve_mirrors(spec, None), 60.0, 3, 1.0, {}, 1 << 30)
    fetcher.fetch("t10k-labels-idx1-ubyte.gz", md5, os.path.join(folder, "t10k-labels-idx1-ubyte.gz"))
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from collections.abc import Iterable
from typing import Any

from tasks.domain.credentials import MIRROR_CREDENTIALS_ENV_VAR
from tasks.domain.dataset_registry import DatasetSpec
from tasks.domain.file_copy import copy_to_file
from tasks.domain.urls import expand_path, is_url, mask_url
from trainlib.errors import describe_error, is_transient, with_retries
from trainlib.masking import redact_text

logger = logging.getLogger("trainlib")

MIRRORS_ENV_VAR = "TRAINLIB_DATA_MIRRORS"


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


def resolve_mirrors(spec: DatasetSpec, mirrors: Iterable[str] | str | None) -> list[str]:
    """The base URLs to try, in order: ``mirrors`` (a string is split at commas), else ``$TRAINLIB_DATA_MIRRORS``,
    else the data set's official mirrors."""
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


class MirrorFetcher:
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
        max_file_bytes: int,
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
            # The pid in the name: a killed fetch's file is swept by the next fetch (sweep_dead_parts).
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


def sweep_dead_parts(folder: str) -> None:
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
    # MirrorFetcher marks a mirror that stayed unreachable through its retries with
    # "(after N attempt(s))", and later files skip it as "unreachable earlier".
    return all(error.endswith("attempt(s))") or error.startswith("skipped, unreachable") for _, error in exc.attempts)
