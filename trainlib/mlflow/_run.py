"""Finding the MLflow experiment and opening (or continuing) the MLflow run of a trainlib run. Driver only.

``open_logged_run`` is what ``MLflowLogger.before_run`` does once mlflow is imported: every call bounded in time,
records an earlier outage left in the spool sent first, and any failure one clear ``TrackingError``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import TYPE_CHECKING, Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from trainlib._internal.tracking.params import params_for_logging, truncate
from trainlib._internal.util.masking import redact_text, redact_url
from trainlib._internal.util.versions import package_version, trainlib_version
from trainlib.callbacks import RunInfo
from trainlib.mlflow._records import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH, send_record
from trainlib.mlflow._store import bounded_http, sqlite_artifact_root
from trainlib.mlflow.errors import TrackingError, short_error

if TYPE_CHECKING:
    from trainlib.mlflow._sender import RecordSender

logger = logging.getLogger("trainlib")


@dataclasses.dataclass(frozen=True)
class LoggedRun:
    """The MLflow run that a logger logs a trainlib run to."""

    experiment_id: str
    run_id: str


def open_logged_run(
    sender: RecordSender,
    experiment_name: str,
    run: RunInfo,
    saved: dict[str, Any],
    *,
    run_name: str | None,
    log_checkpoints: str,
    tags: dict[str, Any],
) -> LoggedRun:
    """The experiment and the MLflow run (``_open_run``) of ``run``, through ``sender``'s client.

    Raises:
        TrackingError: the tracking store cannot be reached, or refuses the experiment or the run.
    """
    client, uri = sender.client, sender.uri
    try:
        with bounded_http():
            experiment = experiment_id(client, uri, experiment_name)
            if sender.pending():
                # An earlier outage left records behind (an old end status among them):
                # send them before this run reopens the MLflow run.
                sender.replay()
            run_id = _open_run(client, uri, experiment, run, saved, run_name, _run_tags(run, log_checkpoints, tags))
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - every cause becomes one clear error
        raise TrackingError(
            f"MLflowLogger cannot reach the MLflow tracking store at {redact_url(uri)} "
            f"({short_error(exc)}). Nothing was started. Start the server (e.g. `mlflow server "
            "--host 127.0.0.1 --port 5000`), or point MLflowLogger(tracking_uri=...) / "
            "MLFLOW_TRACKING_URI at a reachable one, or remove MLflowLogger from RunConfig.callbacks "
            "to train without tracking."
        ) from None
    return LoggedRun(experiment, run_id)


def experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``, created when missing (next to a local SQLite store's database)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {name!r} at {redact_url(uri)} is deleted: restore it "
                f"(`mlflow experiments restore --experiment-id {experiment.experiment_id}`) or pass "
                "another MLflowLogger(experiment_name=...)."
            )
        return experiment.experiment_id
    root = sqlite_artifact_root(uri)
    location = os.path.join(root, re.sub(r"[^A-Za-z0-9._-]+", "_", name)) if root else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id  # created concurrently


def _run_tags(run: RunInfo, log_checkpoints: str, tags: dict[str, Any]) -> dict[str, str]:
    """The tags of trainlib run ``run``'s MLflow run: trainlib's, then the user's ``tags`` (redacted, cut)."""
    return {
        "trainlib.run_name": run.name,
        "trainlib.storage_path": redact_url(run.path),
        "trainlib.world_size": str(run.world_size),
        "trainlib.device_type": "cuda" if run.use_gpu else "cpu",
        "trainlib.torch_version": package_version("torch"),
        "trainlib.version": trainlib_version(),
        "trainlib.log_checkpoints": log_checkpoints,
        **{str(k): truncate(redact_text(str(v)), MAX_TAG_VAL_LENGTH) for k, v in tags.items()},
    }


def _open_run(
    client: MlflowClient,
    uri: str,
    experiment: str,
    run: RunInfo,
    saved: dict[str, Any],
    run_name: str | None,
    run_tags: dict[str, str],
) -> str:
    """The MLflow run of trainlib run ``run``: the one in ``saved`` (a restart or resume), else a new one.

    Logs the run's params (only new keys on a continued run: MLflow params are immutable) and ``run_tags``.
    """
    params = params_for_logging(
        {
            "": run.train_loop_config,
            "scaling_config": run.scaling_config,
            "checkpoint_config": run.record.checkpoint_config,
            "failure_config": run.record.failure_config,
        },
        MAX_ENTITY_KEY_LENGTH,
        MAX_PARAM_VAL_LENGTH,
    )
    previous = _previous_run(client, uri, saved)
    if previous is not None:
        run_id = previous.info.run_id
        client.update_run(run_id, status="RUNNING")
        old = previous.data.params
        changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
        if changed:
            logger.warning(
                "MLflow params are immutable: run %s keeps its first values of %s; the resumed run's "
                "new values are in trainlib_run.json.",
                run_id,
                ", ".join(changed),
            )
        params = {k: v for k, v in params.items() if k not in old}
        run_tags["trainlib.resumed"] = str(int(previous.data.tags.get("trainlib.resumed", "0")) + 1)
        if run.resumed_from:
            run_tags["trainlib.resumed_from"] = run.resumed_from
        logger.info("MLflow: continuing run %s of trainlib run %s", run_id, run.name)
    else:
        created = client.create_run(experiment, run_name=run_name or run.name)
        run_id = created.info.run_id
    if params:
        send_record(client, {"run_id": run_id, "kind": "params", "params": params})
    send_record(client, {"run_id": run_id, "kind": "tags", "tags": run_tags})
    return run_id


def _previous_run(client: MlflowClient, uri: str, saved: dict[str, Any]) -> Any:
    run_id = saved.get("run_id")
    if not run_id:
        return None
    try:
        previous = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        logger.warning(
            "MLflow run %s of this trainlib run is not in %s: starting a new MLflow run.", run_id, redact_url(uri)
        )
        return None
    if previous.info.lifecycle_stage == "deleted":
        logger.warning("MLflow run %s of this trainlib run was deleted: starting a new MLflow run.", run_id)
        return None
    return previous
