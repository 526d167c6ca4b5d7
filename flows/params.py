"""The pipeline's parameters: one pydantic model. Runs wherever the flow or the CLI runs.

Everything else is derived from :class:`PipelineParams`: the flow's signature (so the
deployment's parameter schema, enforced by the Prefect server), the options of
``python -m flows.main`` with their help and defaults, and the error messages for bad input.
Locations left unset (``storage_path``, ``data_cache_dir``, ``mlflow_tracking_uri``) are
resolved in the flow run from the pipeline's home (:mod:`tasks.domain.home`), so the CLI, a
deployment run and a direct call share one registry.

Example::

    params = PipelineParams(epochs=2, mirrors=["/data/fashion-mnist"])
    training_pipeline(params)
    # deployment: prefect deployment run 'training-pipeline/fashion-mnist-retrain' -p 'params={"epochs": 2}'
"""

from __future__ import annotations

import difflib
import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.domain.credentials import (
    MIRROR_CREDENTIALS_ENV_VAR,
    MLFLOW_PASSWORD_ENV_VAR,
    MLFLOW_USERNAME_ENV_VAR,
    credential_fields,
)
from tasks.domain.dataset_registry import DATASET_NAMES
from tasks.domain.promotion import DEFAULT_MIN_MARGIN
from tasks.domain.recipe import DEFAULT_RECIPE, RecipeName
from tasks.domain.urls import mask_url

DatasetName = Literal[DATASET_NAMES]  # type: ignore[valid-type]  # the registry's names, nowhere else
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
DEFAULT_DATASET = "fashion-mnist"


def data_name(source: str) -> str:
    """A data source's short name: a built-in data set's, or the last part of a folder's or manifest's path
    (``s3://bucket/pets`` -> ``pets``, ``/data/labels.csv`` -> ``labels``)."""
    name = posixpath.basename(source.split("?", 1)[0].rstrip("/\\")) or source
    name = re.sub(r"\.(csv|parquet)$", "", name, flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "images"


def default_model_name(source: str) -> str:
    """The registered model a data source's runs use unless told otherwise: ``<data_name>-resnet18``."""
    return f"{data_name(source)}-resnet18"


class PipelineParamsError(ValueError):
    """Bad pipeline parameters: the message names each bad parameter, its value and what is allowed."""


class PipelineParams(BaseModel):
    """Every parameter of one pipeline run, validated on construction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: DatasetName = Field(DEFAULT_DATASET, description="The built-in data set to train on (when data is unset).")
    data: str | None = Field(
        None,
        min_length=1,
        max_length=2000,
        description="Your images: a folder of class folders (ROOT/<class>/<image>, optional train/ and test/, "
        "arrivals as ROOT/<batch>/<class>/<image>), or a manifest (.csv/.parquet with path,label[,split]); a local "
        "path or an fsspec URL such as s3://bucket/pets; or a built-in set's name (default: dataset).",
    )
    image_size: int | None = Field(
        None, ge=8, le=2048, description="Resize your images to this square size (default: their most common size)."
    )
    max_bad_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of unusable files (corrupt, empty, not images, too small) above which the run fails; "
        "below it they are left out and reported.",
    )
    min_image_size: int = Field(8, ge=1, le=4096, description="Images narrower or lower than this are left out.")
    allow_class_changes: bool = Field(
        False, description="Train even when classes appeared or vanished against the champion's data."
    )
    mirrors: list[str] | None = Field(
        None,
        description="Base URLs or folders to fetch the data set from, tried in order (default: "
        "$TRAINLIB_DATA_MIRRORS, else the official internet mirrors).",
    )
    epochs: int = Field(1, gt=0, le=1000, description="Training epochs.")
    recipe: RecipeName = Field(
        DEFAULT_RECIPE,
        description="Training recipe: 'augmented' (SGD, one-cycle LR, weight "
        "decay, label smoothing, crops and flips; best at 10 "
        "epochs) or 'tutorial' (the Ray Train tutorial's Adam at "
        "1e-3; better in runs of a few hundred steps).",
    )
    lr: float | None = Field(
        None, ge=0, le=10, description="(Peak) learning rate (default: the recipe's; 0 trains nothing: a baseline)."
    )
    batch_size: int = Field(128, gt=0, le=65536, description="Batch size per worker.")
    num_workers: int = Field(2, ge=1, le=4096, description="DDP workers, one process each.")
    use_gpu: bool = Field(False, description="Train on one GPU per worker.")
    limit: int | None = Field(None, gt=0, description="Train on the first N training images only.")
    test_limit: int | None = Field(None, gt=0, description="Evaluate on the first N test images only.")
    num_to_keep: int | None = Field(2, gt=0, description="Checkpoints kept on disk (the best ones and the latest).")
    checkpoint_score_attribute: str | None = Field(
        "val_accuracy", description="Metric that ranks checkpoints; the best one is evaluated."
    )
    max_failures: int = Field(0, ge=-1, description="Worker-group restarts allowed (-1: unlimited).")
    seed: int = Field(0, ge=0, description="Seed of the model's initial weights and the data split.")
    storage_path: str | None = Field(
        None,
        description="trainlib run storage, a folder or s3:// URL (default: $TRAINLIB_STORAGE_PATH, "
        "else $TRAINLIB_HOME/runs).",
    )
    data_cache_dir: str | None = Field(
        None, description="Each node's data cache (default: $TRAINLIB_DATA_CACHE, else $TRAINLIB_HOME/datasets)."
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking server or store (default: $MLFLOW_TRACKING_URI, else "
        "sqlite:///$TRAINLIB_HOME/mlflow.db).",
    )
    experiment_name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="MLflow experiment (default: the data's name: the built-in set's, or the folder's or manifest's).",
    )
    min_margin: float = Field(
        DEFAULT_MIN_MARGIN,
        ge=0,
        lt=1,
        description="How much higher (absolute test accuracy, e.g. 0.005) the new version must "
        "score than the champion on the same images to replace it.",
    )
    min_new_images: int = Field(
        1,
        ge=1,
        description="A run whose data (a folder or manifest source) has fewer new images than this since the "
        "champion's snapshot ends at once, Completed, training nothing.",
    )
    force: bool = Field(False, description="Train even when the source has no new images since the champion's.")
    init_from: Literal["scratch", "champion"] = Field(
        "scratch",
        description="'champion': start from the champion's weights (same classes and architecture) with the "
        "recipe's fine-tuning schedule (lower learning rate, fewer epochs); 'scratch': random weights.",
    )
    max_class_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Promotion gate: no class's test accuracy may be lower than the champion's on that class by more "
        "than this (absolute, e.g. 0.05); unset: no such gate.",
    )
    min_accuracy: float | None = Field(
        None, ge=0, le=1, description="Promotion gate: the lowest test accuracy a new champion may have (e.g. 0.85)."
    )
    newest_slice_min_accuracy: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Promotion gate: the lowest accuracy on the newest batch's test images; unset: that accuracy is "
        "reported only.",
    )
    model_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=200,
        description="Registered model name in MLflow (default: '<dataset>-resnet18', one model per data set).",
    )
    run_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=200,
        description="trainlib run name; a run of that name is continued (default: derived from the flow "
        "run, so a retry continues its own training).",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="How the workers spread over the cluster's nodes (STRICT_SPREAD: one per node)."
    )
    ray_address: str | None = Field(
        None,
        description="A Ray cluster: its GCS address (head:6379) or ray://head:10001 (default: $RAY_ADDRESS, "
        "as set inside a Ray job, else a local Ray for this run).",
    )
    placement_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for the cluster to grant the workers.")
    train_timeout_s: float = Field(6 * 3600.0, gt=0, description="The train task's timeout in seconds.")

    @model_validator(mode="before")
    @classmethod
    def _known_names_only(cls, values: Any) -> Any:
        # pydantic's "Extra inputs are not permitted" names neither the parameters that exist nor a fix.
        if isinstance(values, dict):
            unknown = [k for k in values if k not in cls.model_fields]
            if unknown:
                raise ValueError("; ".join(_unknown_message(k) for k in unknown))
        return values

    @model_validator(mode="before")
    @classmethod
    def _model_name_of_the_dataset(cls, values: Any) -> Any:
        # Each data set registers under its own name (and logs to its own experiment) by default: a champion is only
        # ever compared on its own data.
        if isinstance(values, dict):
            source = values.get("data") or values.get("dataset") or DEFAULT_DATASET
            if values.get("model_name") is None:
                values = {**values, "model_name": default_model_name(source)}
            if values.get("experiment_name") is None:
                values = {**values, "experiment_name": data_name(source)}
        return values

    @model_validator(mode="after")
    def _no_credentials(self) -> PipelineParams:
        # Prefect stores a flow run's parameters in clear (its API, its database, the UI).
        found = credential_fields(self.mirrors, self.mlflow_tracking_uri, self.data)
        if found:
            raise ValueError(
                f"{', '.join(found)} holds credentials, which the flow run's parameters would keep in clear. Pass "
                f"the URL without them and set ${MLFLOW_USERNAME_ENV_VAR} / ${MLFLOW_PASSWORD_ENV_VAR} (MLflow) or "
                f"${MIRROR_CREDENTIALS_ENV_VAR} (mirrors) where the pipeline runs; `python -m flows.main` moves "
                "them there itself. Data on S3 reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
                "from the environment of every node."
            )
        return self

    @property
    def source(self) -> str:
        """What to train on: ``data`` when set, else the built-in ``dataset``."""
        return self.data or self.dataset

    @classmethod
    def parse(cls, values: dict[str, Any], as_options: bool = False) -> PipelineParams:
        """Validate ``values``; raise :class:`PipelineParamsError` with one readable line per bad parameter.

        ``as_options`` names them as the command line's options (``--num-workers``).
        """
        try:
            return cls(**values)
        except ValidationError as exc:
            raise PipelineParamsError(describe_errors(exc, as_options)) from None


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(name, PipelineParams.model_fields, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown parameter {name!r}: {hint}known parameters: {', '.join(PipelineParams.model_fields)}"


def allowed_values(name: str) -> str:
    """What parameter ``name`` accepts, in words (from its type and constraints)."""
    schema = PipelineParams.model_json_schema()["properties"][name]
    options = schema.get("anyOf", [schema])
    words = []
    for option in options:
        if "enum" in option:
            words.append("one of " + ", ".join(repr(v) for v in option["enum"]))
            continue
        kind = option.get("type")
        if kind == "null":
            words.append("unset (null)")
            continue
        bounds = [
            f"{op} {option[key]}"
            for key, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))
            if key in option
        ]
        if "pattern" in option:
            bounds.append(f"matching {option['pattern']}")
        kind_words = {
            "integer": "an integer",
            "number": "a number",
            "string": "a string",
            "boolean": "true or false",
            "array": "a list of strings",
        }.get(kind, str(kind))
        words.append(" ".join([kind_words, " and ".join(bounds)]).strip())
    return " or ".join(words)


def option_name(name: str) -> str:
    """The command-line option of parameter ``name``: ``num_workers`` -> ``--num-workers``."""
    return "--" + name.replace("_", "-")


def describe_errors(exc: ValidationError, as_options: bool = False) -> str:
    """One line per bad parameter: its name (or CLI option), the value given, why, and what is allowed."""
    lines = []
    for error in exc.errors():
        location = [str(part) for part in error["loc"]]
        name = next((part for part in location if part in PipelineParams.model_fields), None)
        message = error["msg"].removeprefix("Value error, ")
        if name is None:
            lines.append(f"  - {message}")
            continue
        given = _masked(error.get("input"))
        shown = f"{option_name(name)} {given!r}" if as_options else f"{name}={given!r}"
        lines.append(f"  - {shown}: {message}. Allowed: {allowed_values(name)}.")
    return f"Invalid pipeline {'options' if as_options else 'parameters'}:\n" + "\n".join(lines)


def _masked(value: Any) -> Any:
    """A parameter's value as an error message may show it: URLs with their credentials masked."""
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value
