"""Version lookup: an installed package's version, and trainlib's own. Driver and workers."""

from __future__ import annotations

import importlib.metadata


def package_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def trainlib_version() -> str:
    from trainlib import __version__

    return __version__
