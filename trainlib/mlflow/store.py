"""The MLflow store: the default tracking URI (library and pipeline alike), bounded HTTP. Driver only."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from trainlib._internal import tunables
from trainlib._internal.util.paths import expand_path


def default_tracking_uri(home: str | os.PathLike | None = None) -> str:
    """The MLflow store of trainlib and its pipeline: ``MLFLOW_TRACKING_URI`` if set, else a SQLite store.

    Args:
        home: the folder of the SQLite store ``<home>/mlflow.db`` (its artifacts go to
            ``<home>/mlartifacts``); default the current directory.

    Example:
        >>> default_tracking_uri()            # 'sqlite:////work/mlflow.db' without MLFLOW_TRACKING_URI
        >>> default_tracking_uri("~/.trainlib")  # 'sqlite:////home/me/.trainlib/mlflow.db'
    """
    folder = expand_path(home) if home is not None else os.getcwd()
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(folder, 'mlflow.db')}"


def sqlite_artifact_root(tracking_uri: str) -> str | None:
    """``<db folder>/mlartifacts`` for a local SQLite store (the folder ``mlflow server`` uses too)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db_path = tracking_uri[len("sqlite:///"):]
    return os.path.join(os.path.dirname(expand_path(db_path)), "mlartifacts")


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """Bound MLflow's HTTP retries and timeout for the logger's own calls (unless the user set them)."""
    limits = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": tunables.MLFLOW_HTTP_MAX_RETRIES,
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": tunables.MLFLOW_HTTP_BACKOFF_FACTOR,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": tunables.MLFLOW_HTTP_TIMEOUT_S,
    }
    added = [name for name in limits if name not in os.environ]
    for name in added:
        os.environ[name] = str(limits[name])
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


# Where MLflowLogger keeps its state in the run record's callback state.
STATE_KEY = "mlflow"
