"""The training pipeline's steps, a subflow on Ray: download (or snapshot + validate) -> train -> evaluate -> register.

Runs in the flow-run process, which :func:`flows.pipeline.training_pipeline` imports it in only when a run
trains (a run that skips an unchanged week imports neither Ray nor torch); each step is a task on prefect-ray's
``RayTaskRunner``. A built-in idx set is downloaded and staged; a user's folder or
manifest is snapshotted into this training run's storage and validated instead (docs/data.md). The training
task reserves no CPU/GPU: its DDP workers hold them. Returns the run's
:class:`flows.summary.PipelineSummary` with each step's seconds.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect_ray.context import remote_options

from flows.heartbeats import end_flow_runs_without_joining_heartbeats
from flows.pipeline_run import PipelineRun, gate_settings
from flows.preflight import current_api_url
from flows.progress_display import ProgressDisplay
from flows.summary import PipelineSummary, StageTimes, Stopwatch
from flows.task_runner import (
    check_cluster_reach,
    largest_node_cpus,
    make_task_runner,
    ray_worker_env,
    workers_have_env,
)
from tasks.artifacts import artifact_key
from tasks.data import snapshot_data, validate_data
from tasks.domain.champion import unscored_champion_error
from tasks.domain.data_source import is_builtin
from tasks.domain.data_validation import ValidationSettings
from tasks.domain.data_version import DataVersion, snapshot_location
from tasks.domain.dataset_registry import get_dataset_spec
from tasks.domain.lineage import dataset_identity
from tasks.domain.model_card import ModelCard
from tasks.domain.progress import ProgressBoard
from tasks.domain.urls import join_url, mask_url
from tasks.domain.warm_start import warm_start_training
from tasks.download import download_dataset
from tasks.evaluate import evaluate
from tasks.register import register
from tasks.train import train_model

# Before any flow of this module runs: its runs end without waiting up to 1 s for Prefect's heartbeat thread.
end_flow_runs_without_joining_heartbeats()

OTHER_STEPS_TIMEOUT_S = 3600.0  # download + evaluate + register, on top of the train task's timeout


def run_on_ray(run: PipelineRun, api_url: str) -> PipelineSummary:
    """Start (or join) Ray and run the steps as a subflow of the current flow run; Ray stops after them."""
    params = run.params
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
        return steps(run)


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
