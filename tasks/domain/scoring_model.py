"""The registered version a batch-scoring run uses: picked by alias, its requirements checked, loaded per worker.

Plain functions, no Prefect; the scoring flow's tasks wrap them. :func:`resolve_alias` and
:func:`requirement_mismatches` run once per flow run, in its resolve task (every chunk then uses the same
pinned version, even if the alias moves meanwhile); :func:`load_model` runs on the Ray workers that score
the chunks and loads the model once per worker process (cached), never per image.
:mod:`tasks.domain.batch_scoring` scores with it.

Example::

    model = resolve_alias("fashion-mnist-resnet18", "champion", tracking_uri)
    pyfunc, loaded_now = load_model(model)
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from tasks.domain.champion import alias_version, registry_call
from tasks.domain.urls import mask_url


class ModelAliasError(LookupError):
    """The registered model or its alias does not exist; the message says how to create it."""


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A registered version picked by alias.

    Attributes:
        name: the registered model.
        alias: the alias asked for (e.g. ``champion``).
        version: the version the alias pointed to when resolved.
        tracking_uri: the MLflow server or store holding it.
        source: where the version's files are (MLflow's download URI); empty: ask the registry.
    """

    name: str
    alias: str
    version: str
    tracking_uri: str
    source: str = ""

    @property
    def model_uri(self) -> str:
        """The pinned version's URI (not the alias, which may move during a run)."""
        return f"models:/{self.name}/{self.version}"

    @property
    def load_uri(self) -> str:
        """What the workers load: the files themselves when known. A ``models:/`` URI would make each
        worker open the registry's store first (~1.4 s of CPU for a SQLite one: SQLAlchemy and its checks)."""
        return self.source or self.model_uri


def resolve_alias(model_name: str, alias: str, tracking_uri: str) -> ResolvedModel:
    """The version ``alias`` of ``model_name`` points to.

    Raises:
        ModelAliasError: no such registered model, or it has no such alias; the message names both
            and how to create a champion.
        DanglingAliasError: the alias points at a deleted version (named).
        RegistryUnavailableError: the registry stayed locked (never read as "no such model").
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    # Retried while the registry is locked; an alias pointing at a deleted version names it (tasks.domain.champion).
    version = alias_version(client, model_name, alias)
    if version is None:
        try:
            model = registry_call(f"reading model {model_name!r}", lambda: client.get_registered_model(model_name))
            known = sorted(model.aliases)
            what = f"Registered model {model_name!r} has no alias {alias!r} (its aliases: {known or 'none'})"
        except MlflowException:
            what = f"There is no registered model {model_name!r}"
        raise ModelAliasError(
            f"{what} in MLflow at {mask_url(tracking_uri)}. Create a champion by running the training pipeline "
            "(`python -m flows.main` or the fashion-mnist-retrain deployment), which registers a version and "
            f"promotes it; or point the alias at an existing version: MlflowClient().set_registered_model_alias("
            f"{model_name!r}, {alias!r}, '<version>')."
        )
    return ResolvedModel(
        name=model_name,
        alias=alias,
        version=str(version.version),
        tracking_uri=tracking_uri,
        source=client.get_model_version_download_uri(model_name, version.version),
    )


def requirement_mismatches(model: ResolvedModel) -> list[str]:
    """The model's pinned requirements (``requirements.txt``) that this Python's packages do not satisfy.

    MLflow checks this on every load by scanning every installed package (~1.7 s of CPU); the
    scoring flow checks once, here, and its workers load with that check off.
    """
    from importlib.metadata import PackageNotFoundError, version

    import mlflow
    from packaging.requirements import InvalidRequirement, Requirement

    from trainlib.mlflow import using_tracking_uri

    with using_tracking_uri(model.tracking_uri):
        path = mlflow.artifacts.download_artifacts(artifact_uri=f"{model.load_uri.rstrip('/')}/requirements.txt")
    problems = []
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            try:
                installed = version(requirement.name)
            except PackageNotFoundError:
                problems.append(f"{line} (not installed)")
                continue
            if requirement.specifier and not requirement.specifier.contains(installed.split("+")[0], prereleases=True):
                problems.append(f"{line} (installed: {installed})")
    return problems


_LOADED: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()


def load_model(model: ResolvedModel) -> tuple[Any, bool]:
    """The pyfunc model of ``model``, loaded once per process (Ray reuses worker processes across chunks).

    Returns the model and whether this call loaded it (False: it came from this process's cache).
    """
    import mlflow

    from trainlib.mlflow import using_tracking_uri

    key = (model.tracking_uri, model.model_uri)
    with _LOAD_LOCK:
        loaded_now = key not in _LOADED
        if loaded_now:
            with using_tracking_uri(model.tracking_uri):
                # The requirements were checked once for the run (requirement_mismatches): not again per worker.
                _LOADED[key] = mlflow.pyfunc.load_model(model.load_uri, suppress_warnings=True)
        return _LOADED[key], loaded_now
