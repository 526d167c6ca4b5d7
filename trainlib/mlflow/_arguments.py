"""``MLflowLogger``'s arguments, checked as it is built: one clear error naming the argument. Driver only."""

from __future__ import annotations

from typing import Any

LOG_CHECKPOINTS_CHOICES = ("all", "best", "last", "uri")
DEFAULT_EXPERIMENT_NAME = "trainlib"


def check_logger_arguments(
    tracking_uri: Any, experiment_name: Any, run_name: Any, tags: Any, log_checkpoints: Any
) -> None:
    """Raise TypeError or ValueError, naming the argument, the value and what to give instead."""
    if tracking_uri is not None and (not isinstance(tracking_uri, str) or not tracking_uri):
        raise TypeError(
            f"MLflowLogger(tracking_uri={tracking_uri!r}) must be a URI string such as "
            "'http://127.0.0.1:5000' or 'sqlite:///mlflow.db', or None for the default."
        )
    if experiment_name is not None and (not isinstance(experiment_name, str) or not experiment_name.strip()):
        raise ValueError(
            f"MLflowLogger(experiment_name={experiment_name!r}) must be a non-empty string, e.g. "
            "'fashion-mnist', or None for the default 'trainlib'."
        )
    if run_name is not None and not isinstance(run_name, str):
        raise TypeError(f"MLflowLogger(run_name={run_name!r}) must be a string or None.")
    if tags is not None and not isinstance(tags, dict):
        raise TypeError(f"MLflowLogger(tags={tags!r}) must be a dict of tag name -> value.")
    if log_checkpoints not in LOG_CHECKPOINTS_CHOICES:
        raise ValueError(
            f"MLflowLogger(log_checkpoints={log_checkpoints!r}) is invalid: use one of "
            f"{', '.join(repr(c) for c in LOG_CHECKPOINTS_CHOICES)} ('uri' records the checkpoints' "
            "storage URIs without copying them)."
        )
