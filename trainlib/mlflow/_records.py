"""Sending one tracking record to MLflow, live or from the spool, and sorting its errors. Driver only.

A record is a JSON-able dict: ``{"run_id", "tracking_uri", "kind": metrics|params|tags|artifacts|status, ...}``.
"""

from __future__ import annotations

from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import BAD_REQUEST, RESOURCE_DOES_NOT_EXIST
from mlflow.tracking import MlflowClient

from trainlib.checkpoint import Checkpoint

# MLflow's limits on one run's entries (mlflow.utils.validation); read from MLflow when it has them.
try:
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH
except ImportError:  # pragma: no cover - older or newer MLflow without these names
    MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH = 250, 6000, 8000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000

# MLflow errors that a retry cannot fix: the call is reported as rejected, not spooled.
REJECTED_CODES = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS",
    "BAD_REQUEST",
    "INVALID_STATE",
}


def is_rejected(exc: BaseException) -> bool:
    return isinstance(exc, MlflowException) and exc.error_code in REJECTED_CODES


def send_record(client: MlflowClient, record: dict[str, Any]) -> None:
    """Send one tracking record (the same code path live and when replaying the spool)."""
    run_id, kind = record["run_id"], record["kind"]
    if kind in ("metrics", "params", "tags"):
        if kind == "metrics":
            entries = [
                Metric(key, float(value), int(record["timestamp"]), int(record["step"]))
                for key, value in record["metrics"].items()
            ]
        else:
            entries = [(Param if kind == "params" else RunTag)(k, v) for k, v in record[kind].items()]
        size = METRICS_PER_BATCH if kind == "metrics" else PARAMS_PER_BATCH
        for i in range(0, len(entries), size):
            client.log_batch(run_id, **{kind: entries[i : i + size]}, synchronous=True)
    elif kind == "artifacts":
        checkpoint = record.get("_checkpoint") or Checkpoint.from_uri(record["source"])
        if not checkpoint._fs.exists(checkpoint.path):
            raise MlflowException(
                f"checkpoint {record['source']} no longer exists (deleted by retention?)",
                error_code=RESOURCE_DOES_NOT_EXIST,  # the proto's code: MLflow reads a string as INTERNAL_ERROR
            )
        with checkpoint.as_directory() as folder:
            client.log_artifacts(run_id, folder, record["artifact_path"])
    elif kind == "status":
        client.set_terminated(run_id, record["status"], end_time=int(record["end_time"]))
    else:
        raise MlflowException(f"unknown spool record kind {kind!r}", error_code=BAD_REQUEST)


def spoolable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("_")}
