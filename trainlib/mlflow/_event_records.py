"""The tracking records that ``MLflowLogger`` makes of a trainlib run's events. Driver only.

A record is a JSON-able dict (``_records.py`` sends it, ``_sender.py`` spools it): a report's metrics, a committed
or deleted checkpoint's tags and artifact, a failure's tags, the error of a failed run. Like ``logger.py``, this
module does not import mlflow.
"""

from __future__ import annotations

import logging
import posixpath
from typing import TYPE_CHECKING, Any

from trainlib._internal.metrics import is_number
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.tracking.params import truncate
from trainlib._internal.util.masking import redact_text
from trainlib.callbacks import ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint

if TYPE_CHECKING:
    from trainlib.errors import WorkerError
    from trainlib.result import Result

logger = logging.getLogger("trainlib")

CHECKPOINT_ARTIFACT_DIR = "checkpoints"


def tag_value(text: str) -> str:
    """``text`` cut to MLflow's longest tag value (read from mlflow, which ``before_run`` imported)."""
    from trainlib.mlflow._records import MAX_TAG_VAL_LENGTH

    return truncate(text, MAX_TAG_VAL_LENGTH)


def report_records(report: ReportRecord, log_checkpoints: str, skipped_keys: set[str]) -> list[dict[str, Any]]:
    """A report's numeric metrics at its step, and its checkpoint's tags (and artifact with ``"all"``).

    Warns once per metric name that is not a number (``skipped_keys``: the names warned about already).
    """
    metrics = {k: v for k, v in report.metrics.items() if is_number(v)}
    skipped = sorted(set(report.metrics) - set(metrics) - skipped_keys)
    if skipped:  # strings, lists, objects: kept in the run's metrics, but MLflow metrics are numbers
        skipped_keys.update(skipped)
        logger.warning(
            "MLflow logs only numeric metrics: %s (reported from step %d on) not logged to MLflow; "
            "they are kept in Result.metrics and metrics_dataframe.",
            ", ".join(skipped),
            report.step,
        )
    records: list[dict[str, Any]] = []
    if metrics:
        records.append(
            {"kind": "metrics", "step": report.step, "metrics": metrics, "timestamp": int(report.reported_at * 1000)}
        )
    if report.checkpoint is None:
        return records
    name = posixpath.basename(report.checkpoint.path.rstrip("/"))
    tags = {"trainlib.latest_checkpoint": report.checkpoint.uri}
    if log_checkpoints == "uri":
        tags[f"trainlib.checkpoint.{name}"] = report.checkpoint.uri
    records.append({"kind": "tags", "tags": tags})
    if log_checkpoints == "all":
        records.append(checkpoint_artifact(report.checkpoint))
    return records


def deleted_checkpoint_records(checkpoint: Checkpoint, log_checkpoints: str) -> list[dict[str, Any]]:
    """With ``"uri"``, the checkpoint's tag says that retention deleted it."""
    if log_checkpoints != "uri":
        return []
    name = posixpath.basename(checkpoint.path.rstrip("/"))
    return [
        {"kind": "tags", "tags": {f"trainlib.checkpoint.{name}": tag_value(f"deleted by retention: {checkpoint.uri}")}}
    ]


def failure_record(failures: int, failure: WorkerError) -> dict[str, Any]:
    """The tags of the run's ``failures``-th failed attempt, ``failure``."""
    return {
        "kind": "tags",
        "tags": {
            "trainlib.failures": str(failures),
            "trainlib.last_failure": tag_value(redact_text(f"rank {failure.rank}: {failure.cause}")),
        },
    }


def end_records(run: RunInfo, result: Result, log_checkpoints: str) -> tuple[list[dict[str, Any]], bool]:
    """The records of the run's end before its status: the chosen checkpoint (``"best"``/``"last"``) and the
    error of a failed run; and whether it failed."""
    records: list[dict[str, Any]] = []
    if log_checkpoints in ("best", "last"):
        chosen = result.checkpoint
        if log_checkpoints == "best" and result.best_checkpoints:
            chosen = result.best_checkpoints[-1][0]  # Ray Train's order: best last
        if chosen is not None:
            records.append({"kind": "tags", "tags": {f"trainlib.{log_checkpoints}_checkpoint": chosen.uri}})
            records.append(checkpoint_artifact(chosen))
    failed = result.error is not None or run.record.status is RunStatus.FAILED
    if failed:
        message = run.record.error or f"{type(result.error).__name__}: {result.error}"
        records.append({"kind": "tags", "tags": {"trainlib.error": tag_value(redact_text(message))}})
    return records, failed


def checkpoint_artifact(checkpoint: Checkpoint) -> dict[str, Any]:
    """The record that copies ``checkpoint`` to the run's artifacts, ``checkpoints/<its folder name>``."""
    name = posixpath.basename(checkpoint.path.rstrip("/"))
    return {
        "kind": "artifacts",
        "source": checkpoint.uri,
        "artifact_path": f"{CHECKPOINT_ARTIFACT_DIR}/{name}",
        "_checkpoint": checkpoint,
    }
