"""The current champion as the evaluate and register steps see it, and why it cannot be compared. Runs in their
task processes (and the scoring flow's).

Promotion fails closed: a champion that the registry cannot name (locked past its retries, an alias that
points at a deleted version), that is a model of other data (another data set, class list or input), or
that cannot be loaded or scored is never replaced silently. A champion of other data is not compared at
all (:class:`ChampionMismatchError`, before anything is registered); one that cannot be scored leaves the
new version registered as ``challenger``, not promoted, and the flow run fails naming the champion's
version and the error (:func:`unscored_champion_error`), so that the pipeline's failure alerts fire.

Example::

    version = alias_version(MlflowClient(tracking_uri=uri), "fashion-mnist-resnet18")  # None: no champion
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from tasks.domain.promotion import CHALLENGER_ALIAS, CHAMPION_ALIAS, ChampionScore

# A SQLite registry answers "database is locked" after its own 20 s busy wait; a few more tries ride out a
# long write by another pipeline (another run registering its model).
REGISTRY_ATTEMPTS = 4
REGISTRY_RETRY_DELAY_S = 2.0
DATASET_TAG = "dataset"  # the data set a version was trained on (ModelCard.tags)

T = TypeVar("T")


class ChampionError(RuntimeError):
    """The champion cannot be compared with the challenger, so the challenger is not promoted."""


class RegistryUnavailableError(ChampionError):
    """The model registry did not answer (e.g. its database stayed locked): never read as "no champion"."""


class DanglingAliasError(ChampionError):
    """The ``champion`` alias points at a version that does not exist (deleted)."""


class ChampionMismatchError(ChampionError):
    """The champion is a model of other data (data set, class list or input): the two are not comparable."""


def is_locked(exc: BaseException) -> bool:
    """Whether a registry error is a busy database (SQLite's "database is locked"): worth another try."""
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def registry_call(what: str, call: Callable[[], T], attempts: int | None = None) -> T:
    """``call()``, tried again while the registry's database is locked.

    Raises:
        RegistryUnavailableError: still locked after the last try; other errors as they are.
    """
    attempts = attempts or REGISTRY_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - only a locked database is retried
            if not is_locked(exc):
                raise
            if attempt == attempts:
                raise RegistryUnavailableError(
                    f"The MLflow model registry stayed locked while {what} ({attempts} tries; "
                    f"{str(exc).splitlines()[0][:200]}): another process holds its database. Run again when it "
                    "is free; with several pipelines at once, use an MLflow tracking server instead of a SQLite "
                    "file (mlflow server --backend-store-uri sqlite:///...)."
                ) from None
            time.sleep(REGISTRY_RETRY_DELAY_S * attempt)
    raise AssertionError("unreachable")


def alias_version(client: Any, model_name: str, alias: str = CHAMPION_ALIAS) -> Any | None:
    """The ``ModelVersion`` (with its tags) that ``alias`` of ``model_name`` points to; None when there is no
    such registered model or it has no such alias.

    Raises:
        DanglingAliasError: the alias points at a version that does not exist.
        RegistryUnavailableError: the registry stayed locked; any other registry error as it is.
    """
    from mlflow.exceptions import MlflowException

    try:
        return registry_call(
            f"reading alias {alias!r} of {model_name!r}", lambda: client.get_model_version_by_alias(model_name, alias)
        )
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
    try:
        model = registry_call(f"reading model {model_name!r}", lambda: client.get_registered_model(model_name))
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    target = model.aliases.get(alias)
    if target is None:
        return None
    raise DanglingAliasError(
        f"The alias {alias!r} of registered model {model_name!r} points to version {target}, which does not exist "
        f"(deleted?). Point it at an existing version: MlflowClient().set_registered_model_alias({model_name!r}, "
        f"{alias!r}, '<version>'), or delete it: MlflowClient().delete_registered_model_alias({model_name!r}, "
        f"{alias!r}) (the next pipeline run then registers its model as the first champion)."
    )


def champion_version(client: Any, model_name: str) -> str | None:
    """The version the ``champion`` alias points to, or None (no such model or alias); see :func:`alias_version`."""
    champion = alias_version(client, model_name)
    return None if champion is None else str(champion.version)


def check_same_data(
    model_name: str,
    version: str,
    dataset: str,
    champion_dataset: str | None,
    class_names: tuple[str, ...] | None = None,
    champion_class_names: list[str] | None = None,
    expected_input: str | None = None,
    champion_input: str | None = None,
) -> None:
    """Refuse to compare a challenger with a champion of other data; a champion recording none is comparable.

    Raises:
        ChampionMismatchError: naming the champion's version, what differs and the fix.
    """
    differences = []
    if champion_dataset and champion_dataset != dataset:
        differences.append(f"it was trained on {champion_dataset!r}, this run on {dataset!r}")
    if champion_class_names is not None and class_names is not None and tuple(champion_class_names) != class_names:
        differences.append(f"its classes are {list(champion_class_names)}, this run's {list(class_names)}")
    if champion_input and expected_input and champion_input != expected_input:
        differences.append(f"it takes {champion_input!r}, this run's model {expected_input!r}")
    if differences:
        raise ChampionMismatchError(
            f"The champion of {model_name!r} (version {version}) is not comparable with this run's model: "
            f"{'; '.join(differences)}. Nothing was registered. Register this run under its own model name "
            f"(--model-name, default: '<dataset>-resnet18'), or move that champion alias away first."
        )


def unscored_champion_error(model_name: str, champion: ChampionScore, new_version: str) -> ChampionError | None:
    """The error that ends a run whose champion could not be loaded or scored (None: it was scored, or none)."""
    if champion.version is None or champion.error is None:
        return None
    return ChampionError(
        f"Champion version {champion.version} of {model_name!r} could not be loaded or scored ({champion.error}). "
        f"The new version {new_version} is registered as {CHALLENGER_ALIAS!r} but not promoted: a champion that "
        "cannot be compared is never replaced. Repair or re-register the champion (or point the alias at a "
        f"version that loads: MlflowClient().set_registered_model_alias({model_name!r}, {CHAMPION_ALIAS!r}, "
        f"'{new_version}')), then run again."
    )
