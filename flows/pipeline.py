"""The training pipeline flow: download (or snapshot + validate) -> train on Ray -> evaluate -> register.

Runs in the flow-run process.

The flow-run process is a ``prefect worker`` subprocess, ``python -m flows.main``, or whatever
calls :func:`training_pipeline`. Its parameters are one :class:`flows.params.PipelineParams`
(validated by Prefect before anything starts); locations left unset come from the pipeline's
home (:class:`tasks.domain.home.PipelineHome`), so every entry point shares one registry.
A built-in idx set is downloaded and staged; a user's folder or manifest (``data``) is listed
into this training run's snapshot and validated instead (docs/data.md). The steps run as a
subflow on prefect-ray's ``RayTaskRunner``. The training task
reserves no CPU/GPU: its DDP workers hold them.
"""

from __future__ import annotations

import dataclasses

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.states import Completed, State
from prefect_ray.context import remote_options

from deployments import FLOW_NAME  # the name prefect.yaml's deployment and the alerts refer to
from flows.heartbeats import end_flow_runs_without_joining_heartbeats
from flows.params import PipelineParams, default_model_name
from flows.preflight import check_services
from flows.progress_display import ProgressDisplay
from flows.summary import PipelineSummary, StageTimes, Stopwatch
from flows.task_runner import (
    check_cluster_reach,
    cluster_address,
    current_api_url,
    largest_node_cpus,
    make_task_runner,
    ray_worker_env,
    workers_have_env,
)
from tasks.artifacts import artifact_key
from tasks.data import snapshot_data, validate_data
from tasks.domain.champion import unscored_champion_error
from tasks.domain.data_change import source_change
from tasks.domain.data_source import check_source, is_builtin
from tasks.domain.data_validation import ValidationSettings
from tasks.domain.data_version import DataVersion, snapshot_location
from tasks.domain.dataset_registry import get_dataset_spec
from tasks.domain.gates import GateSettings
from tasks.domain.home import PipelineHome
from tasks.domain.lineage import dataset_identity, source_tags
from tasks.domain.model_package import ModelCard
from tasks.domain.progress import ProgressBoard
from tasks.domain.recipe import get_recipe
from tasks.domain.training_run import TrainingSettings
from tasks.domain.urls import expand_path, join_url, mask_url
from tasks.domain.warm_start import warm_start_training
from tasks.download import download_dataset
from tasks.evaluate import evaluate
from tasks.register import register
from tasks.train import train_model

# Before any flow of this module runs: its runs end without waiting up to 1 s for Prefect's heartbeat thread.
end_flow_runs_without_joining_heartbeats()

OTHER_STEPS_TIMEOUT_S = 3600.0  # download + evaluate + register, on top of the train task's timeout


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


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """One run's parameters with every location resolved, as the steps need them.

    Attributes:
        params: the validated parameters.
        training: the training run's settings (its name is stable for the flow run).
        data_cache_dir: this node's data cache.
        mlflow_tracking_uri: the MLflow store and registry.
        tags: tags for the MLflow run and the registered version.
    """

    params: PipelineParams
    training: TrainingSettings
    data_cache_dir: str
    mlflow_tracking_uri: str
    tags: dict[str, str]


def gate_settings(params: PipelineParams) -> GateSettings:
    """The promotion gates the parameters configure (besides ``min_margin``)."""
    return GateSettings(
        max_class_drop=params.max_class_drop,
        min_accuracy=params.min_accuracy,
        newest_slice_min_accuracy=params.newest_slice_min_accuracy,
    )


def resolve_run(params: PipelineParams, flow_run_id: str, home: PipelineHome) -> PipelineRun:
    """Fill the unset locations from ``home`` and name the training run after the flow run."""
    run_name = params.run_name or f"{params.model_name}-{flow_run_id[:8]}"
    cache = expand_path(params.data_cache_dir or home.data_cache)
    training = TrainingSettings(
        run_name=run_name,
        storage_path=expand_path(params.storage_path or home.storage_path),
        node_cache_dir=cache,
        epochs=params.epochs,
        recipe=get_recipe(params.recipe, params.lr),
        batch_size=params.batch_size,
        num_workers=params.num_workers,
        use_gpu=params.use_gpu,
        num_to_keep=params.num_to_keep,
        checkpoint_score_attribute=params.checkpoint_score_attribute or None,
        max_failures=params.max_failures,
        limit=params.limit,
        seed=params.seed,
        placement_timeout_s=params.placement_timeout_s,
        placement_strategy=params.placement_strategy,
    )
    return PipelineRun(
        params=params,
        training=training,
        data_cache_dir=cache,
        mlflow_tracking_uri=params.mlflow_tracking_uri or home.mlflow_tracking_uri,
        tags={
            "prefect.flow_run_id": flow_run_id,
            "dataset": mask_url(params.source),
            "trainlib.run_name": run_name,
            "recipe": params.recipe,
            **source_tags(f"flows.pipeline:{FLOW_NAME}"),
        },
    )


@flow(name="pipeline-steps")
def pipeline_steps(run: PipelineRun) -> PipelineSummary:
    """The four steps, each a task on the Ray cluster; returns a summary with each step's seconds."""
    # A local Ray that the task runner started has the workers' environment already (inherited); a Ray
    # this process had joined (a notebook, a test) or a cluster gets it per task, or the tasks' Prefect
    # records would go nowhere.
    if workers_have_env(get_run_context().task_runner):
        return _run_steps(run)
    with remote_options(runtime_env={"env_vars": ray_worker_env(current_api_url())}):
        return _run_steps(run)


def _run_steps(run: PipelineRun) -> PipelineSummary:
    params = run.params
    check_cluster_reach(current_api_url(), run.mlflow_tracking_uri, run.training.storage_path, params.mirrors)
    report, register_tags = None, dict(run.tags)
    with Stopwatch() as download_time:
        if is_builtin(params.source):
            staged = download_dataset.submit(
                params.source, params.mirrors, run.data_cache_dir, join_url(run.training.storage_path, "datasets")
            ).result()
        else:  # the user's data: this run's snapshot, validated
            snapshot_uri = snapshot_location(run.training.storage_path, run.training.run_name)
            taken = snapshot_data.submit(params.source, run.data_cache_dir, snapshot_uri).result()
            settings = ValidationSettings(
                max_bad_fraction=params.max_bad_fraction,
                min_size=params.min_image_size,
                allow_class_changes=params.allow_class_changes,
                image_size=params.image_size,
            )
            with remote_options(num_cpus=largest_node_cpus()):  # decodes on every CPU of its node
                prepared = validate_data.submit(
                    taken, run.data_cache_dir, snapshot_uri, settings, params.model_name, run.mlflow_tracking_uri
                ).result()
            staged, report = prepared.version, prepared.report
            register_tags.update(staged.tags())
            get_run_logger().info("Data version %s (snapshot %s)", staged.digest[:12], mask_url(staged.snapshot_uri))

    training_settings, train_tags = run.training, dict(run.tags)
    if params.init_from == "champion":
        if isinstance(staged, DataVersion):
            classes, channels = staged.spec.class_names, staged.spec.channels
        else:
            classes, channels = get_dataset_spec(staged.name).class_names, 1
        training_settings, warm = warm_start_training(
            run.training, params.model_name, run.mlflow_tracking_uri, classes, channels
        )
        train_tags.update(warm.tags())
        register_tags.update(warm.tags())
        get_run_logger().info(
            "Warm start from champion version %s: %d epoch(s) at lr %g (the recipe's fine-tuning schedule)",
            warm.parent_version,
            training_settings.epochs,
            training_settings.recipe.lr,
        )

    with Stopwatch() as train_time:
        board = ProgressBoard.create()  # rank 0 tells it where it is within the epoch; the display reads it
        display = ProgressDisplay(
            board,
            get_run_logger(),
            key=artifact_key("training-progress", params.model_name),
            description=f"Training run {run.training.run_name}",
        )
        train = train_model.with_options(timeout_seconds=params.train_timeout_s)
        try:
            with display, remote_options(num_cpus=0, num_gpus=0):  # the DDP workers hold the CPUs/GPUs
                training = train.submit(
                    staged,
                    training_settings,
                    run.mlflow_tracking_uri,
                    params.experiment_name,
                    train_tags,
                    board,
                    report,
                ).result()
        finally:
            board.remove()

    with Stopwatch() as evaluate_time, remote_options(num_cpus=largest_node_cpus()):  # the workers are done
        comparison = evaluate.submit(
            training, staged, run.data_cache_dir, params.test_limit, run.mlflow_tracking_uri, params.model_name
        ).result()
    report = comparison.report

    with Stopwatch() as register_time:
        if isinstance(staged, DataVersion):
            card = ModelCard(dataset=staged.identity(), recipe=run.training.recipe.record(), image_spec=staged.spec)
        else:
            card = ModelCard(dataset=dataset_identity(staged), recipe=run.training.recipe.record())
        registration = register.submit(
            training,
            comparison,
            card,
            params.model_name,
            run.mlflow_tracking_uri,
            params.min_margin,
            register_tags,
            gate_settings(params),
        ).result()
    # Fails closed: a champion that could not be scored was kept; the run fails so that its alerts fire.
    unscored = unscored_champion_error(params.model_name, comparison.champion, str(registration.version))
    if unscored is not None:
        raise unscored

    return PipelineSummary(
        run_path=training.run_path,
        checkpoint=training.checkpoint_uri,
        mlflow_run_id=training.mlflow_run_id,
        model_name=registration.model_name,
        model_version=str(registration.version),
        champion_version=str(registration.champion_version),
        promoted=registration.decision.promote,
        decision=registration.decision.reason,
        test_accuracy=report.accuracy,
        test_loss=report.loss,
        champion_test_accuracy=comparison.champion.accuracy,
        recipe=params.recipe,
        downloaded_files=list(getattr(staged, "downloaded", ())),
        data_digest=getattr(staged, "digest", None),
        training_metrics=training.metrics,
        fit_seconds=training.seconds,
        stage_times=StageTimes(
            download=download_time.time, train=train_time.time, evaluate=evaluate_time.time, register=register_time.time
        ),
        gates=registration.decision.gates,
        newest_slice=comparison.newest_slice,
    )


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
    task_runner = make_task_runner(params.ray_address, api_url)
    # Ray starts (or is joined) here, so a local one's workers start while Prefect creates the steps' subflow run,
    # whose runner (a duplicate: the flow carries it to every task, so not the one holding this process's Ray)
    # runs the tasks on it. Stopped after the steps.
    with task_runner:
        steps = pipeline_steps.with_options(
            task_runner=task_runner.duplicate(),
            flow_run_name=f"{get_run_context().flow_run.name}-steps",
            timeout_seconds=params.train_timeout_s + OTHER_STEPS_TIMEOUT_S,
        )
        summary = steps(run)
    logger.info(
        "Done: test accuracy %.2f%%, %s version %s (%s)%s",
        100 * summary.test_accuracy,
        params.model_name,
        summary.model_version,
        summary.decision,
        f"; data version {summary.data_digest}" if summary.data_digest else "",
    )
    return summary
