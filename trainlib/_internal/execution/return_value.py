"""Rank 0's return value (``Result.return_value``): pickled on the worker, unpickled on the driver."""

from __future__ import annotations

import logging
from typing import Any

from trainlib._internal.execution.messages import DoneMessage

logger = logging.getLogger("trainlib")


def pickled_return_value(value: Any) -> bytes | None:
    """``value`` pickled for ``Result.return_value``; None (with a warning) when it cannot be: the run itself
    finished, and its checkpoints and metrics are committed."""
    if value is None:
        return None
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        logger.warning(
            "The training function returned a %s, which cannot be pickled (%s: %s): Result.return_value is None. "
            "Return a picklable value, e.g. plain numbers, lists, dicts or a model's state_dict().",
            type(value).__name__,
            type(exc).__name__,
            exc,
        )
        return None


def unpickled_return_value(message: DoneMessage) -> Any:
    """Rank 0's return value from its done message; None (with a warning) when it cannot be unpickled here."""
    try:
        return message.return_value()
    except Exception as exc:  # noqa: BLE001 - e.g. its class is not importable here; the run itself finished
        logger.warning(
            "Rank 0's return value cannot be unpickled on the driver (%s: %s): Result.return_value is "
            "None. Return plain values (numbers, lists, dicts, tensors).",
            type(exc).__name__,
            exc,
        )
        return None
