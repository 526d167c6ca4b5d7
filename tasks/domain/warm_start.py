"""Warm start: a run that begins from the champion's weights instead of random ones. Runs in the flow's process.

:func:`prepare_warm_start` loads the champion (its registered pyfunc, whose network is the one the
workers build), checks that it has this run's classes, input channels and architecture, and writes
its weights to run storage; the workers load them before the first step (``init_weights_uri`` in the
training config, :func:`tasks.domain.training_loop.load_initial_weights`; a resumed run continues from its own checkpoint instead). The version registered from
such a run records its parent (``parent_version``). No Prefect here.

Example::

    warm = prepare_warm_start("pets-resnet18", tracking_uri, "resnet18-1ch-small", ("cat", "dog"), 3, weights_uri)
    warm.tags()  # {"init_from": "champion", "parent_version": "4"}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from tasks.domain.data_source import open_fs
from tasks.domain.recipe import fine_tuning
from tasks.domain.training_run import TrainingSettings
from tasks.domain.urls import join_url


class WarmStartError(ValueError):
    """The champion cannot seed this run: the message names each difference and the fix."""


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Where a warm-started run's initial weights are, and whose they are.

    Attributes:
        parent_version: the champion version the weights come from.
        weights_uri: its network's state dict in run storage.
    """

    parent_version: str
    weights_uri: str

    def tags(self) -> dict[str, str]:
        """Tags for the MLflow run and the registered version."""
        return {"init_from": "champion", "parent_version": self.parent_version}


def prepare_warm_start(
    model_name: str,
    tracking_uri: str,
    architecture: str,
    class_names: Sequence[str],
    in_channels: int,
    weights_uri: str,
) -> WarmStart:
    """Check the champion of ``model_name`` against this run and write its weights to ``weights_uri``.

    Raises:
        WarmStartError: no champion, or one with other classes, input channels or architecture (each named).
    """
    import mlflow
    from mlflow import MlflowClient

    from tasks.domain.champion import alias_version
    from trainlib.mlflow import using_tracking_uri

    version = alias_version(MlflowClient(tracking_uri=tracking_uri), model_name)
    if version is None:
        raise WarmStartError(
            f"init_from='champion': {model_name} has no champion in {tracking_uri} to start from: "
            "train from scratch first (init_from='scratch')."
        )
    with using_tracking_uri(tracking_uri):
        loaded = mlflow.pyfunc.load_model(f"models:/{model_name}/{version.version}", suppress_warnings=True)
    classifier = loaded.unwrap_python_model()
    network = classifier.network
    theirs = {
        "architecture": (loaded.model_config or {}).get("architecture"),
        "classes": list(classifier.class_names),
        "input channels": _input_channels(network),
    }
    ours = {"architecture": architecture, "classes": list(class_names), "input channels": in_channels}
    differences = [
        f"{key}: champion {theirs[key]!r}, this run {ours[key]!r}" for key in ours if theirs[key] != ours[key]
    ]
    if differences:
        raise WarmStartError(
            f"init_from='champion': champion version {version.version} of {model_name} does not fit this run ("
            + "; ".join(differences)
            + "): train from scratch (init_from='scratch'), or use the champion's recipe and classes."
        )
    fs, path = open_fs(weights_uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as handle:
        torch.save(network.state_dict(), handle)
    return WarmStart(parent_version=str(version.version), weights_uri=weights_uri)


def warm_start_training(
    settings: TrainingSettings, model_name: str, tracking_uri: str, class_names: Sequence[str], in_channels: int
) -> tuple[TrainingSettings, WarmStart]:
    """``settings`` for a run from the champion's weights: its recipe's fine-tuning schedule, the weights' URI.

    The weights are written beside the run's folder in run storage (``<storage>/warm_start/<run name>.pt``).
    """
    recipe, epochs = fine_tuning(settings.recipe, settings.epochs)
    warm = prepare_warm_start(
        model_name,
        tracking_uri,
        settings.recipe.architecture,
        class_names,
        in_channels,
        join_url(join_url(settings.storage_path, "warm_start"), f"{settings.run_name}.pt"),
    )
    return dataclasses.replace(settings, recipe=recipe, epochs=epochs, init_weights_uri=warm.weights_uri), warm


def _input_channels(network: torch.nn.Module) -> int:
    first = next(m for m in network.modules() if isinstance(m, torch.nn.Conv2d))
    return int(first.in_channels)
