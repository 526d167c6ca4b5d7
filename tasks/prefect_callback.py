"""A trainlib callback that writes a training run's events to the Prefect task run's log. Runs on the driver.

The driver is the train task's process. trainlib calls the callback after each committed
report; the Prefect logger only queues the record (its API handler ships logs in the
background), so nothing here waits on the Prefect server while trainlib commits. trainlib
itself knows nothing of Prefect.
"""

from __future__ import annotations

from typing import Any

import trainlib


class PrefectLogCallback(trainlib.Callback):
    """Forwards rank 0's committed reports, failures and the run's end to a Prefect run logger.

    Args:
        logger: a Prefect run logger (``get_run_logger()`` in the task).
    """

    def __init__(self, logger: Any):
        self.logger = logger

    def before_run(self, run: trainlib.RunInfo) -> None:
        resumed = f", resuming from {run.resumed_from}" if run.resumed_from else ""
        self.logger.info(
            "Training run %s: %d worker(s)%s, folder %s%s",
            run.name,
            run.world_size,
            " with GPUs" if run.use_gpu else " on CPUs",
            run.path,
            resumed,
        )

    def after_report(self, run: trainlib.RunInfo, report: trainlib.ReportRecord) -> None:
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in report.metrics.items())
        where = f", checkpoint {report.checkpoint.uri}" if report.checkpoint else ""
        self.logger.info("rank 0 report %d: %s%s", report.step, shown, where)

    def after_failure(self, run: trainlib.RunInfo, failure: trainlib.WorkerError, will_restart: bool) -> None:
        then = "restarting from the latest checkpoint" if will_restart else "no restarts left"
        self.logger.warning("Worker rank %d failed (%s); %s", failure.rank, failure.cause, then)

    def after_run(self, run: trainlib.RunInfo, result: trainlib.Result) -> None:
        if result.error is None:
            self.logger.info("Training run %s finished: %s", run.name, result.metrics)
