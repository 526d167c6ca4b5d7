"""The MLflow store: the default tracking URI (library and pipeline alike), bounded HTTP, a quick probe. Driver only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

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
    db_path = tracking_uri[len("sqlite:///") :]
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


def probe_tracking_server(tracking_uri: str, timeout_s: float | None = None) -> None:
    """Fail in seconds when an ``http(s)://`` tracking server does not answer (stores of other kinds: no-op).

    One ``GET /health`` bounded by ``MLFLOW_PROBE_TIMEOUT_S``: a server that is down, or that
    accepts connections and never answers, costs seconds here instead of MLflow's retries.
    Any HTTP answer (even 401 or 404 from a proxy) counts as reachable.

    Raises:
        TrackingError: no answer in time.
    """
    import urllib.error
    import urllib.request

    from trainlib._internal.util.masking import redact_url, split_credentials
    from trainlib.mlflow.errors import TrackingError

    if not tracking_uri.startswith(("http://", "https://")):
        return
    timeout_s = tunables.MLFLOW_PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    # Credentials in the URI go as MLflow's client sends them (basic auth), never as part of the host name.
    parts = split_credentials(tracking_uri)
    headers = {"Authorization": parts.basic_auth} if parts.basic_auth else {}
    try:
        request = urllib.request.Request(parts.url.rstrip("/") + "/health", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(
            f"The MLflow tracking server at {redact_url(tracking_uri)} did not answer within {timeout_s:.0f} s "
            f"({type(reason).__name__}: {reason}). Nothing was started. Start the server (e.g. `mlflow server "
            "--host 127.0.0.1 --port 5000`), point MLflowLogger(tracking_uri=...) / MLFLOW_TRACKING_URI at a "
            "reachable one, or remove MLflowLogger from RunConfig.callbacks to train without tracking."
        ) from None


# Where MLflowLogger keeps its state in the run record's callback state.
STATE_KEY = "mlflow"


@contextlib.contextmanager
def using_tracking_uri(uri: str) -> Iterator[None]:
    """Use ``uri`` as MLflow's tracking URI inside the block; restore the caller's setting after."""
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    import mlflow

    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
