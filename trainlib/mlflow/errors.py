"""``TrackingError``: MLflow tracking could not start; ``short_error``: an MLflow failure in one line. Driver only.

No mlflow import here: the logger's module uses both before it imports mlflow.
"""

from __future__ import annotations

from trainlib._internal.tracking.params import truncate
from trainlib._internal.util.masking import redact_text
from trainlib.errors import TrainlibError


class TrackingError(TrainlibError):
    """MLflow tracking could not start (server unreachable, bad URI, bad experiment)."""


def short_error(exc: BaseException) -> str:
    """``exc`` as one line of at most 300 characters, with secrets in URLs masked: for logs and tags."""
    return truncate(redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0]), 300)
