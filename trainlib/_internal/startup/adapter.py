"""The one place where the start-up layer replaces attributes of Ray, Prefect and MLflow. Driver and workers.

Every replacement of another library's (mostly private) attribute goes through :func:`replaced_attribute`
(for a block) or :func:`install_attribute` (for the process). Each is made only where

- the start-up layer is on: ``TRAINLIB_LEAN_STARTUP=0`` (or ``false``/``no``/``off``) turns the whole layer
  off, and ``fit()`` and the pipeline then start Ray with a stock ``ray.init`` (docs/startup.md);
- the library's installed version is in the minor series the replacements were checked on
  (:data:`CHECKED_VERSIONS`). With any other version the library keeps its own behaviour, and one
  line in the ``trainlib`` log says so, once per library and process.

An owner that lacks the attribute (the same version built differently) is left alone too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("trainlib")

LEAN_STARTUP_ENV_VAR = "TRAINLIB_LEAN_STARTUP"
_OFF_VALUES = ("0", "false", "no", "off")

# The versions the replacements were written and tested against (the versions CI installs; pyproject.toml's
# ranges). A release of the same minor series is accepted; any other keeps the library's own behaviour.
CHECKED_VERSIONS = {"ray": "2.60.0", "prefect": "3.9.1", "mlflow": "3.17.2"}

_reported: set[str] = set()  # the libraries whose unchecked version was logged in this process


def lean_startup_enabled() -> bool:
    """Whether the start-up layer is on (the default): ``$TRAINLIB_LEAN_STARTUP`` is not 0/false/no/off."""
    return os.environ.get(LEAN_STARTUP_ENV_VAR, "1").strip().lower() not in _OFF_VALUES


def installed_version(library: str) -> str | None:
    """The ``__version__`` of the imported top-level package ``library``, or None when it is not imported."""
    module = sys.modules.get(library)
    return getattr(module, "__version__", None) if module is not None else None


def _minor_series(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def version_checked(library: str) -> bool:
    """Whether the installed ``library`` is in the minor series of :data:`CHECKED_VERSIONS`; log once if not."""
    checked = CHECKED_VERSIONS.get(library)
    installed = installed_version(library)
    if checked is not None and installed is not None and _minor_series(installed) == _minor_series(checked):
        return True
    if library not in _reported:
        _reported.add(library)
        logger.warning(
            "trainlib's start-up layer was checked on %s %s, not %s: %s keeps its own behaviour (slower start-up)",
            library,
            checked or "(no version)",
            installed or "(not imported)",
            library,
        )
    return False


def library_of(owner: Any) -> str:
    """The top-level package that defines ``owner`` (a module, class or function): ``ray`` for ``ray._private.node.Node``."""
    name = owner.__name__ if isinstance(owner, type(sys)) else getattr(owner, "__module__", "") or ""
    return name.split(".", 1)[0]


def may_replace(owner: Any, name: str) -> bool:
    """Whether ``owner.<name>`` may be replaced: the layer is on, the library's version checked, the attribute there."""
    if not lean_startup_enabled() or not version_checked(library_of(owner)):
        return False
    return getattr(owner, name, None) is not None


@contextlib.contextmanager
def replaced_attribute(owner: Any, name: str, replacement: Callable[[Any], Any]) -> Iterator[bool]:
    """Inside the block, ``owner.<name>`` is ``replacement(original)`` where :func:`may_replace` allows it; the
    block gets whether it was replaced. Not thread-safe against another thread using the attribute meanwhile."""
    if not may_replace(owner, name):
        yield False
        return
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield True
    finally:
        setattr(owner, name, original)


def install_attribute(owner: Any, name: str, replacement: Callable[[Any], Any]) -> bool:
    """Set ``owner.<name>`` to ``replacement(original)`` for the rest of the process where :func:`may_replace`
    allows it; return whether it was set."""
    if not may_replace(owner, name):
        return False
    setattr(owner, name, replacement(getattr(owner, name)))
    return True
