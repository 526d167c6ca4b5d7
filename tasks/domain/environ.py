"""Environment variables set for a block of code, then restored as they were. Driver only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` in this process's environment for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
