"""``TrackingError``: MLflow tracking could not start. Driver only."""

from __future__ import annotations

from trainlib.errors import TrainlibError


class TrackingError(TrainlibError):
    """MLflow tracking could not start (server unreachable, bad URI, bad experiment)."""
