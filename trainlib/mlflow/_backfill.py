"""A resumed run's metrics that MLflow lacks: committed to run storage, never sent (the driver died). Driver only."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainlib._internal.metrics import is_number
from trainlib.callbacks import ReportRecord
from trainlib.mlflow._store import bounded_http
from trainlib.mlflow.errors import short_error

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger("trainlib")


def missing_metrics_records(
    client: MlflowClient, run_id: str, reports: tuple[ReportRecord, ...]
) -> list[dict[str, Any]]:
    """The records that log the committed reports' metrics that MLflow run ``run_id`` lacks (to be sent or
    spooled like new ones).

    A driver killed between committing a report and sending it (SIGKILL, a lost machine)
    leaves the report in run storage and not in MLflow; the resumed run fills the gap. One
    metric-history read per metric name; when the server cannot answer, nothing is filled.
    """
    steps: dict[str, set[int]] = {}
    try:
        with bounded_http():
            for key in sorted({k for r in reports for k, v in r.metrics.items() if is_number(v)}):
                steps[key] = {m.step for m in client.get_metric_history(run_id, key)}
    except Exception as exc:  # noqa: BLE001 - an outage: the spool covers what this fit() reports
        logger.warning(
            "Could not compare MLflow run %s with the run's %d committed report(s) (%s); reports "
            "a crash kept from MLflow stay missing there.",
            run_id,
            len(reports),
            short_error(exc),
        )
        return []
    records = []
    for report in reports:
        missing = {k: v for k, v in report.metrics.items() if is_number(v) and report.step not in steps[k]}
        if missing:
            records.append(
                {
                    "kind": "metrics",
                    "step": report.step,
                    "metrics": missing,
                    "timestamp": int(report.reported_at * 1000),
                }
            )
    if records:
        logger.warning(
            "MLflow run %s lacked the metrics of %d committed report(s) (the driver stopped before "
            "sending them); logged them now from run storage.",
            run_id,
            len(records),
        )
    return records
