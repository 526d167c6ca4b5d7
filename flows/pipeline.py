"""The training pipeline flow: download (or snapshot + validate) -> train on Ray -> evaluate -> register.

Runs in the flow-run process.

The flow-run process is a ``prefect worker`` subprocess, ``python -m flows.main``, or whatever
calls :func:`training_pipeline` (the deployments' entrypoint ``flows.pipeline:training_pipeline``). Its
parameters are one :class:`flows.params.PipelineParams` (validated by Prefect before anything starts);
locations left unset come from the pipeline's home (:func:`flows.pipeline_run.resolve_run`), so every
entry point shares one registry. A user's source with no new images since the champion's snapshot ends
the run here, before Ray starts; otherwise the steps run as a subflow on prefect-ray's ``RayTaskRunner``
(:mod:`flows.pipeline_steps`, imported only then: a run that skips imports neither Ray nor torch).
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.states import Completed, State

from deployments import FLOW_NAME  # the name prefect.yaml's deployment and the alerts refer to
from flows.heartbeats import end_flow_runs_without_joining_heartbeats
from flows.params import PipelineParams, default_model_name
from flows.pipeline_run import resolve_run
from flows.preflight import check_services, cluster_address, current_api_url
from flows.summary import PipelineSummary
from tasks.domain.data_change import source_change
from tasks.domain.data_source import check_source, is_builtin
from tasks.domain.data_version import snapshot_location
from tasks.domain.home import PipelineHome
from tasks.domain.urls import mask_url

# Before any flow of this module runs: its runs end without waiting up to 1 s for Prefect's heartbeat thread.
end_flow_runs_without_joining_heartbeats()


def flow_run_name() -> str:
    """``<model name>-<YYYY-mm-dd-HHMM>`` of the scheduled start: the same for every retry of the run."""
    from prefect.runtime import flow_run

    params = flow_run.parameters.get("params")
    if isinstance(params, PipelineParams):
        model = params.model_name
    else:
        params = params or {}
        model = params.get("model_name") or default_model_name(
            params.get("data") or params.get("dataset") or PipelineParams.model_fields["dataset"].default
        )
    return f"{model}-{flow_run.scheduled_start_time:%Y-%m-%d-%H%M}"


@flow(name=FLOW_NAME, flow_run_name=flow_run_name, validate_parameters=True)
def training_pipeline(params: PipelineParams = PipelineParams()) -> PipelineSummary | State:  # noqa: B008 - Prefect reads the default
    """Download FashionMNIST (or snapshot the user's data), train the tutorial's ResNet18 with trainlib on Ray,
    evaluate, register. A source with no new images since the champion's snapshot trains nothing: the run
    returns a Completed state saying so (its data: the :class:`tasks.domain.data_change.DataChange`).

    Args:
        params: every setting of the run (see :class:`flows.params.PipelineParams`); unset
            locations come from ``$TRAINLIB_HOME`` (default ``~/.trainlib``).
    """
    logger = get_run_logger()
    api_url = current_api_url()
    flow_run_id = str(get_run_context().flow_run.id)
    run = resolve_run(params, flow_run_id, PipelineHome.resolve())
    logger.info(
        "Run %s: %s on %s, %d worker(s), %d epoch(s); Ray %s; MLflow %s; storage %s",
        run.training.run_name,
        mask_url(params.source),
        "GPUs" if params.use_gpu else "CPUs",
        params.num_workers,
        params.epochs,
        cluster_address(params.ray_address) or "local",
        mask_url(run.mlflow_tracking_uri),
        mask_url(run.training.storage_path),
    )
    check_services(params.ray_address, run.mlflow_tracking_uri)  # seconds, before any step starts
    if not is_builtin(params.source):
        check_source(params.source)  # a missing or unreadable source fails here, before Ray starts
        # Listed here, before Ray starts, so an unchanged week ends in seconds; the steps take this snapshot.
        _, change = source_change(
            params.source,
            run.data_cache_dir,
            params.model_name,
            run.mlflow_tracking_uri,
            snapshot_location(run.training.storage_path, run.training.run_name),
        )
        if change.nothing_new(params.min_new_images) and not params.force:
            message = change.message(params.min_new_images)
            logger.info("Skipped: %s", message)
            return Completed(message=message, data=change)
        logger.info(
            "%d new image(s) of %d since the champion's snapshot %s",
            change.new_images,
            change.images,
            change.champion_digest or "(none)",
        )
    from flows.pipeline_steps import run_on_ray  # Ray, torch and the steps' tasks: imported by a run that trains

    summary = run_on_ray(run, api_url)
    logger.info(
        "Done: test accuracy %.2f%%, %s version %s (%s)%s",
        100 * summary.test_accuracy,
        params.model_name,
        summary.model_version,
        summary.decision,
        f"; data version {summary.data_digest}" if summary.data_digest else "",
    )
    return summary
