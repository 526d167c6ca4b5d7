"""Checks that the services a pipeline run needs answer, in seconds, before anything starts. CLI and flow-run process.

An unreachable Ray address or MLflow server would otherwise be found after the download and
staging (or after minutes of retries): a TCP probe of the Ray address and one bounded request
to the MLflow server say so at once, naming the parameter to fix. Where the Ray cluster and the Prefect API
are is resolved here too. Light on purpose (neither Ray nor torch): a run that skips an unchanged week uses it.
"""

from __future__ import annotations

import os

from trainlib.mlflow import probe_tracking_server
from trainlib.startup import probe_ray_address


class PrefectAPIMissingError(RuntimeError):
    """The flow runs without a Prefect API URL, so Ray workers could not report their task runs."""


def cluster_address(ray_address: str | None) -> str | None:
    """The cluster to run on: ``ray_address``, else ``$RAY_ADDRESS`` (set inside a Ray job), else None (local)."""
    return ray_address or os.environ.get("RAY_ADDRESS") or None


def current_api_url() -> str:
    """This process's Prefect API URL.

    Raises:
        PrefectAPIMissingError: none is set (the flow runs on a temporary in-process server,
            which Ray workers could not reach).
    """
    from prefect.settings import get_current_settings  # flows.main imports this module before it sets the URL

    url = get_current_settings().api.url
    if not url:
        raise PrefectAPIMissingError(
            "PREFECT_API_URL is not set, so the Ray workers would have no Prefect server to report task runs "
            "to. Start one (prefect server start --host 127.0.0.1) and set PREFECT_API_URL="
            "http://127.0.0.1:4200/api, or run the pipeline with `python -m flows.main`, which does both."
        )
    return url


def check_services(ray_address: str | None, mlflow_tracking_uri: str | None) -> None:
    """Raise when the Ray cluster at ``ray_address`` or the MLflow server at ``mlflow_tracking_uri`` does not answer.

    Raises:
        trainlib.ResourcesUnavailableError: the Ray address does not accept connections.
        trainlib.mlflow.TrackingError: the MLflow server does not answer.
    """
    probe_ray_address(ray_address, source="--ray-address / ray_address")
    if mlflow_tracking_uri:
        probe_tracking_server(mlflow_tracking_uri)
