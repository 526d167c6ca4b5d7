"""The MLflow run of a training run: finding it by the trainlib run's name, and its page in the MLflow UI.

Runs on the driver (the pipeline's task processes).

Example::

    run_id = find_run_id(tracking_uri, "fashion-mnist", "fashion-mnist-resnet18-1a2b3c4d")
    run_page_url(tracking_uri, run_id)  # "http://mlflow:5000/#/experiments/1/runs/..."
"""

from __future__ import annotations

from tasks.domain.urls import is_url, mask_url

RUN_NAME_TAG = "trainlib.run_name"  # set by trainlib.mlflow.MLflowLogger on every run it opens
LOCAL_UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store by default


def find_run_id(tracking_uri: str, experiment_name: str, run_name: str) -> str | None:
    """The id of the newest MLflow run in ``experiment_name`` that tracked trainlib run ``run_name``, if any."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def ui_base_url(tracking_uri: str) -> str:
    """The MLflow UI serving ``tracking_uri``: the tracking server itself, else ``mlflow ui`` on this machine."""
    if is_url(tracking_uri) and tracking_uri.split("://", 1)[0] in ("http", "https"):
        return tracking_uri.rstrip("/")
    return LOCAL_UI_URL


def run_page_url(tracking_uri: str, run_id: str) -> str:
    """The page of MLflow run ``run_id`` in the MLflow UI (no credentials in it)."""
    from mlflow import MlflowClient

    experiment_id = MlflowClient(tracking_uri=tracking_uri).get_run(run_id).info.experiment_id
    return f"{mask_url(ui_base_url(tracking_uri))}/#/experiments/{experiment_id}/runs/{run_id}"
