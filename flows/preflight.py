"""Checks that the services a pipeline run needs answer, in seconds, before anything starts. CLI and flow-run process.

An unreachable Ray address or MLflow server would otherwise be found after the download and
staging (or after minutes of retries): a TCP probe of the Ray address and one bounded request
to the MLflow server say so at once, naming the parameter to fix.
"""

from __future__ import annotations

from trainlib.mlflow import probe_tracking_server
from trainlib.startup import probe_ray_address


def check_services(ray_address: str | None, mlflow_tracking_uri: str | None) -> None:
    """Raise when the Ray cluster at ``ray_address`` or the MLflow server at ``mlflow_tracking_uri`` does not answer.

    Raises:
        trainlib.ResourcesUnavailableError: the Ray address does not accept connections.
        trainlib.mlflow.TrackingError: the MLflow server does not answer.
    """
    probe_ray_address(ray_address, source="--ray-address / ray_address")
    if mlflow_tracking_uri:
        probe_tracking_server(mlflow_tracking_uri)
