"""Checks of what a trainer is given besides the training function (see ``train_fn``). Driver only."""

from __future__ import annotations

import json
from typing import Any


def check_metadata(metadata: Any) -> None:
    """``metadata`` must be a JSON-able dict: it is written into every checkpoint's ``.metadata.json``."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}: e.g. metadata={{'owner': 'me'}}.")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serialisable (it is stored with every checkpoint): {exc}.") from None
