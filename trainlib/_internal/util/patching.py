"""Replacing an attribute of another library for the duration of a block (Ray's private start-up steps)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def replaced_attribute(owner: Any, name: str, replacement: Callable[[Any], Any]) -> Iterator[None]:
    """Inside the block, ``owner.<name>`` is ``replacement(original)``.

    An ``owner`` without the attribute (another version of the library) is left alone, and the
    block runs with the library's own behaviour. Not thread-safe against another thread using
    the attribute meanwhile.
    """
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)
