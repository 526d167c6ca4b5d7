"""The training pipeline flow: download -> train on Ray -> evaluate -> register.

Runs in the flow-run process (``prefect worker`` subprocess or ``python -m
flows.main``). ``training_pipeline`` validates its typed parameters (pydantic,
so bad input fails before anything starts) and runs ``pipeline_steps`` as a
subflow on prefect-ray's ``RayTaskRunner``: a local Ray by default, the cluster
at ``ray_address`` otherwise. Every task runs on a Ray worker whose environment
carries this flow's ``PREFECT_API_URL`` (and nothing secret), so all task runs
land in the same Prefect server; ephemeral servers are switched off there.
The training task reserves no CPU/GPU: its DDP workers hold them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from typing import Annotated, Any, Literal, Optional

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.settings import get_current_settings
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options
from pydantic import Field

from tasks.download import download_dataset
from tasks.evaluate import evaluate
from tasks.register import register
from tasks.train import TrainingSettings, train_model
from trainlib.mlflow import default_tracking_uri

FLOW_NAME = "training-pipeline"
DEFAULT_STORAGE_PATH = "~/trainlib_results/pipeline"
DEFAULT_CACHE_DIR = "~/.cache/trainlib/datasets"
DEFAULT_MODEL_NAME = "fashion-mnist-resnet18"


class PrefectAPIMissingError(RuntimeError):
    """The flow runs without a Prefect API URL, so Ray workers could not report their task runs."""


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Every validated parameter of one pipeline run (built by :func:`training_pipeline`)."""

    dataset: str
    mirrors: list[str] | None
    data_cache_dir: str
    training: TrainingSettings
    test_limit: int | None
    mlflow_tracking_uri: str | None
    experiment_name: str
    model_name: str
    tags: dict[str, str]


def ray_worker_env(api_url: str) -> dict[str, str]:
    """Environment for every Ray worker: where the Prefect API is, and never an ephemeral server.

    Only the URL travels; an API key would be a secret, so Prefect Cloud users set it on the
    cluster nodes themselves.
    """
    return {"PREFECT_API_URL": api_url, "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}


def make_task_runner(ray_address: str | None, api_url: str) -> RayTaskRunner:
    """A RayTaskRunner for a local Ray (``ray_address`` None) or the cluster at ``ray_address``."""
    init_kwargs: dict[str, Any] = {"runtime_env": {"env_vars": ray_worker_env(api_url)}}
    if not ray_address:
        init_kwargs["include_dashboard"] = False  # a second of start-up the embedded run does not need
    # "local" starts a new Ray; None would join the last cluster started on this machine.
    return RayTaskRunner(address=ray_address or "local", init_kwargs=init_kwargs)


def current_api_url() -> str:
    """This process's Prefect API URL.

    Raises:
        PrefectAPIMissingError: none is set (the flow runs on a temporary in-process server,
            which Ray workers could not reach).
    """
    url = get_current_settings().api.url
    if not url:
        raise PrefectAPIMissingError(
            "PREFECT_API_URL is not set, so the Ray workers would have no Prefect server to report task runs "
            "to. Start one (prefect server start --host 127.0.0.1) and set PREFECT_API_URL="
            "http://127.0.0.1:4200/api, or run the pipeline with `python -m flows.main`, which does both.")
    return url


@flow(name="pipeline-steps")
def pipeline_steps(config: PipelineConfig) -> dict[str, Any]:
    """The four steps, each a task on the Ray cluster; returns a summary with each step's seconds."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    staged = download_dataset.submit(config.dataset, config.mirrors, config.data_cache_dir,
                                     _join(config.training.storage_path, "datasets")).result()
    seconds["download"] = time.perf_counter() - started

    started = time.perf_counter()
    with remote_options(num_cpus=0, num_gpus=0):  # the DDP workers hold the CPUs/GPUs, not the driver
        training = train_model.submit(staged, config.training, config.mlflow_tracking_uri, config.experiment_name,
                                      config.tags).result()
    seconds["train"] = time.perf_counter() - started

    started = time.perf_counter()
    report = evaluate.submit(training, staged, config.data_cache_dir, config.test_limit, config.mlflow_tracking_uri,
                             config.model_name).result()
    seconds["evaluate"] = time.perf_counter() - started

    started = time.perf_counter()
    registration = register.submit(training, report, config.model_name, config.mlflow_tracking_uri,
                                   config.tags).result()
    seconds["register"] = time.perf_counter() - started

    return {
        "run_path": training.run_path, "checkpoint": training.checkpoint_uri, "mlflow_run_id": training.mlflow_run_id,
        "model_name": registration.model_name, "model_version": registration.version,
        "champion_version": registration.champion_version, "promoted": registration.decision.promote,
        "decision": registration.decision.reason, "test_accuracy": report.accuracy, "test_loss": report.loss,
        "downloaded_files": list(staged.downloaded), "training_metrics": training.metrics,
        "fit_seconds": training.seconds, "stage_seconds": seconds,
    }


@flow(name=FLOW_NAME, validate_parameters=True)
def training_pipeline(
    dataset: Literal["fashion-mnist", "mnist"] = "fashion-mnist",
    mirrors: Optional[list[str]] = None,
    epochs: Annotated[int, Field(gt=0, le=1000, description="Training epochs, > 0")] = 1,
    lr: Annotated[float, Field(ge=0, le=10, description="Adam learning rate (0 trains nothing: a baseline)")] = 1e-3,
    batch_size: Annotated[int, Field(gt=0, le=65536, description="Batch size per worker")] = 128,
    num_workers: Annotated[int, Field(ge=1, le=4096, description="DDP workers (one process each)")] = 2,
    use_gpu: bool = False,
    storage_path: str = DEFAULT_STORAGE_PATH,
    limit: Annotated[Optional[int], Field(gt=0, description="Train on the first N training images")] = None,
    test_limit: Annotated[Optional[int], Field(gt=0, description="Evaluate on the first N test images")] = None,
    num_to_keep: Annotated[Optional[int], Field(gt=0)] = 2,
    checkpoint_score_attribute: Optional[str] = "val_accuracy",
    max_failures: Annotated[int, Field(ge=-1)] = 0,
    seed: int = 0,
    data_cache_dir: str = DEFAULT_CACHE_DIR,
    mlflow_tracking_uri: Optional[str] = None,
    experiment_name: str = "fashion-mnist",
    model_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=200)] = DEFAULT_MODEL_NAME,
    ray_address: Optional[str] = None,
    placement_timeout_s: Annotated[float, Field(gt=0)] = 120.0,
) -> dict[str, Any]:
    """Download FashionMNIST, train the tutorial's ResNet18 with trainlib on Ray, evaluate, register.

    Args:
        dataset: ``fashion-mnist`` (or ``mnist``).
        mirrors: base URLs or folders to fetch the data set from, tried in order (default: the
            ``TRAINLIB_DATA_MIRRORS`` environment variable, else the official internet mirrors).
        epochs, lr, batch_size: the tutorial's settings (``batch_size`` is per worker).
        num_workers, use_gpu: the DDP worker group.
        storage_path: where trainlib keeps runs and the staged data (local folder or ``s3://``).
        limit, test_limit: use only the first N training / test images (quick runs).
        num_to_keep, checkpoint_score_attribute: checkpoint retention; the best one is evaluated.
        max_failures: worker-group restarts allowed (trainlib's FailureConfig).
        seed: model initialisation and data split.
        data_cache_dir: the per-node data cache.
        mlflow_tracking_uri: MLflow server or store (default: ``MLFLOW_TRACKING_URI``, else
            ``sqlite:///<working dir>/mlflow.db``).
        experiment_name, model_name: MLflow experiment and registered model.
        ray_address: a Ray cluster to run on (default: a local Ray started for this run).
        placement_timeout_s: how long to wait for the cluster to grant the workers.
    """
    logger = get_run_logger()
    api_url = current_api_url()
    flow_run = get_run_context().flow_run
    run_name = f"{model_name}-{datetime.datetime.now():%Y%m%d-%H%M%S}-{str(flow_run.id)[:8]}"
    config = PipelineConfig(
        dataset=dataset, mirrors=list(mirrors) if mirrors else None, data_cache_dir=data_cache_dir,
        training=TrainingSettings(
            run_name=run_name, storage_path=_expand(storage_path), epochs=epochs, lr=lr, batch_size=batch_size,
            num_workers=num_workers, use_gpu=use_gpu, num_to_keep=num_to_keep,
            checkpoint_score_attribute=checkpoint_score_attribute or None, max_failures=max_failures, limit=limit,
            seed=seed, node_cache_dir=data_cache_dir, placement_timeout_s=placement_timeout_s),
        test_limit=test_limit, mlflow_tracking_uri=mlflow_tracking_uri or default_tracking_uri(),
        experiment_name=experiment_name,
        model_name=model_name,
        tags={"prefect.flow_run_id": str(flow_run.id), "dataset": dataset, "trainlib.run_name": run_name},
    )
    logger.info("Run %s: %s on %s, %d worker(s), %d epoch(s); Ray %s", run_name, dataset,
                "GPUs" if use_gpu else "CPUs", num_workers, epochs, ray_address or "local")
    steps = pipeline_steps.with_options(task_runner=make_task_runner(ray_address, api_url))
    summary = steps(config)
    logger.info("Done: test accuracy %.2f%%, %s version %s (%s)", 100 * summary["test_accuracy"], model_name,
                summary["model_version"], summary["decision"])
    return summary


def _expand(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name

