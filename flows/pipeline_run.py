"""One training-pipeline run's parameters with every location resolved: what the flow hands its steps.

Runs in the flow-run process (:mod:`flows.pipeline`), before Ray starts. :func:`resolve_run` fills the
locations the :class:`flows.params.PipelineParams` leave unset from the pipeline's home
(:class:`tasks.domain.home.PipelineHome`), names the training run after the flow run and builds the tags
for the MLflow run and the registered version; :func:`gate_settings` turns the parameters' promotion gates
into the register step's :class:`tasks.domain.gates.GateSettings`. The :class:`PipelineRun` is the
steps' subflow's one parameter (:mod:`flows.pipeline_steps`).
"""

from __future__ import annotations

import dataclasses

from deployments import FLOW_NAME  # the flow's name, in the entry point its runs' source tags name
from flows.params import PipelineParams
from tasks.domain.gates import GateSettings
from tasks.domain.home import PipelineHome
from tasks.domain.lineage import source_tags
from tasks.domain.recipe import get_recipe
from tasks.domain.training_run import TrainingSettings
from tasks.domain.urls import expand_path, mask_url


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
