"""``MLflowLogger``: a driver-side callback that logs a trainlib run to MLflow. Runs on the driver only.

``MLflowLogger`` is a driver-side :class:`trainlib.Callback`, so a run has one
MLflow run whatever its world size. It logs the run's configuration as params,
every report's metrics at the report's step, checkpoints as artifacts (or only
their URIs), and ends the MLflow run FINISHED or FAILED like ``fit()``. A
restart after a worker failure and a resume of the same trainlib run continue
the same MLflow run: its id is kept in the run folder's ``trainlib_run.json``.

A tracking outage never costs the training: every MLflow call is bounded in
time, what cannot be sent is written to a local spool file, the logger says
exactly what was not logged, and :meth:`MLflowLogger.replay_spool` sends it later
(``_sender.py``). Opening the MLflow run is in ``_run.py``; the records each event becomes, ``_event_records.py``;
a resumed run's missing metrics, ``_backfill.py``.

This module does not import mlflow: ``before_run`` does (~1-1.5 s of CPU), so building the logger costs
nothing and the import runs while ``fit()`` starts its workers, whose actors were asked for first.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from trainlib._internal.tracking.spool import Spool, spool_file
from trainlib._internal.util.masking import redact_url
from trainlib.callbacks import Callback, ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.mlflow._arguments import DEFAULT_EXPERIMENT_NAME, check_logger_arguments
from trainlib.mlflow._backfill import missing_metrics_records
from trainlib.mlflow._event_records import (
    deleted_checkpoint_records,
    end_records,
    failure_record,
    report_records,
)
from trainlib.mlflow._store import STATE_KEY, default_tracking_uri, probe_tracking_server

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from trainlib.errors import WorkerError
    from trainlib.mlflow._sender import RecordSender
    from trainlib.mlflow._spool import SpoolReplay
    from trainlib.result import Result

logger = logging.getLogger("trainlib")


class MLflowLogger(Callback):
    """Log a trainlib run to MLflow from the driver: one MLflow run per training job.

    Pass it in ``RunConfig(callbacks=[MLflowLogger(...)])``. After ``fit()``,
    ``logger.run_id`` is the MLflow run's id.

    What it logs:
        * params: ``train_loop_config`` (nested dicts flattened to ``a.b.c``),
          ``scaling_config.*``, ``checkpoint_config.*`` and ``failure_config.*``;
          values cut to MLflow's length limit; values of keys whose name holds
          key/secret/token/password/credential, and values that look like
          credentials, are logged as ``[REDACTED]``.
        * tags: ``trainlib.run_name``, ``trainlib.storage_path``,
          ``trainlib.world_size``, ``trainlib.device_type``,
          ``trainlib.torch_version``, ``trainlib.version``, your ``tags``, and at
          the end ``trainlib.error`` when the run failed.
        * metrics: every report's metrics, at the report's step.
        * checkpoints, per ``log_checkpoints``: ``"all"`` copies every committed
          checkpoint to ``checkpoints/checkpoint_NNNNNN``; ``"best"`` and
          ``"last"`` copy one checkpoint when the run ends (best by
          ``CheckpointConfig.checkpoint_score_attribute``); ``"uri"`` copies
          nothing and records each checkpoint's storage URI in a
          ``trainlib.checkpoint.checkpoint_NNNNNN`` tag. Every mode tags
          ``trainlib.latest_checkpoint``.

    Args:
        tracking_uri: the MLflow tracking URI. Default: ``MLFLOW_TRACKING_URI``,
            else the embedded store ``sqlite:///<cwd>/mlflow.db``.
        experiment_name: default ``MLFLOW_EXPERIMENT_NAME``, else ``"trainlib"``.
            Created when missing; on a local SQLite store its artifacts go to
            ``mlartifacts/`` next to the database file.
        run_name: the MLflow run name; default the trainlib run name.
        tags: extra tags for the MLflow run.
        log_checkpoints: ``"all"``, ``"best"``, ``"last"`` or ``"uri"``.
        spool_dir: where records that could not be sent are kept. Default: the
            run folder for local run storage, else ``~/.trainlib/mlflow_spool``.

    Raises:
        TrackingError: from ``fit()`` before any worker starts, when the
            tracking server cannot be reached or refuses the experiment.

    Example:
        >>> logger = MLflowLogger(tracking_uri="http://127.0.0.1:5000", experiment_name="fashion")
        >>> TorchTrainer(train_func, run_config=trainlib.RunConfig(callbacks=[logger])).fit()
        >>> logger.run_id
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: dict[str, Any] | None = None,
        log_checkpoints: str = "all",
        *,
        spool_dir: str | os.PathLike | None = None,
    ):
        check_logger_arguments(tracking_uri, experiment_name, run_name, tags, log_checkpoints)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.log_checkpoints = log_checkpoints
        self.spool_dir = os.fspath(spool_dir) if spool_dir is not None else None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.spool_path: str | None = None
        self._uri = ""
        self._client: MlflowClient | None = None
        self._sender: RecordSender | None = None
        self._failures = 0
        self._saved: dict[str, Any] = {}  # the state an earlier fit() of this run saved (load_state_dict)
        self._skipped_keys: set[str] = set()  # non-numeric metric names already warned about

    def __getstate__(self) -> dict[str, Any]:
        # The trainer may pickle its config; a live client is not needed elsewhere.
        state = self.__dict__.copy()
        state["_client"] = None
        state["_sender"] = None
        return state

    # -- state kept in the run record ------------------------------------------------------

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def state_dict(self) -> dict[str, Any]:
        """The MLflow run of this trainlib run, so restarts and resumes continue it."""
        if self.run_id is None:
            return {}
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": redact_url(self._uri)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved = dict(state)

    # -- hooks -------------------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        self._uri = self.tracking_uri or default_tracking_uri()
        probe_tracking_server(self._uri)  # seconds, not MLflow's minutes of retries; before Ray starts
        from mlflow.tracking import MlflowClient

        from trainlib.mlflow._run import open_logged_run
        from trainlib.mlflow._sender import RecordSender

        self._client = MlflowClient(tracking_uri=self._uri)
        self._failures = 0
        saved, self._saved = self._saved, {}
        self._sender = RecordSender(self._client, self._uri, Spool(spool_file(run.name, run.path, self.spool_dir)))
        self.spool_path = self._sender.spool.path
        opened = open_logged_run(
            self._sender,
            self._experiment_name(),
            run,
            saved,
            run_name=self.run_name,
            log_checkpoints=self.log_checkpoints,
            tags=self.tags,
        )
        self.experiment_id, self.run_id = opened.experiment_id, opened.run_id
        logger.info("MLflow run %s in experiment %r at %s", self.run_id, self._experiment_name(), redact_url(self._uri))
        if saved.get("run_id") == self.run_id and run.earlier_reports:
            for record in missing_metrics_records(self._client, self.run_id, run.earlier_reports):
                self._emit(record)

    def after_report(self, run: RunInfo, report: ReportRecord) -> None:
        for record in report_records(report, self.log_checkpoints, self._skipped_keys):
            self._emit(record)

    def after_checkpoint_deleted(self, run: RunInfo, checkpoint: Checkpoint) -> None:
        for record in deleted_checkpoint_records(checkpoint, self.log_checkpoints):
            self._emit(record)

    def after_failure(self, run: RunInfo, failure: WorkerError, will_restart: bool) -> None:
        self._failures += 1
        self._emit(failure_record(self._failures, failure))

    def after_run(self, run: RunInfo, result: Result) -> None:
        if self.run_id is None or self._sender is None:
            return
        sender = self._sender
        if sender.offline_since is None and sender.pending():
            sender.replay()  # older records first, so the end status below is the last word
        records, failed = end_records(run, result, self.log_checkpoints)
        for record in records:
            self._emit(record)
        status = "FAILED" if failed else "FINISHED"
        self._emit({"kind": "status", "status": status, "end_time": int(time.time() * 1000)})
        sender.finish(self.run_id, status)

    # -- replay --------------------------------------------------------------------------

    @classmethod
    def replay_spool(cls, path: str | os.PathLike, tracking_uri: str | None = None) -> SpoolReplay:
        """Send the records spooled at ``path`` to MLflow, oldest first (see :func:`trainlib.mlflow._spool.replay_spool`).

        Example:
            >>> MLflowLogger.replay_spool("/runs/fashion/mlflow_spool.jsonl")
            SpoolReplay(path=..., sent=12, remaining=0, rejected=())
        """
        from trainlib.mlflow._spool import replay_spool

        return replay_spool(path, tracking_uri)

    # -- internals -------------------------------------------------------------------------

    def _experiment_name(self) -> str:
        return self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT_NAME

    def _emit(self, record: dict[str, Any]) -> None:
        """Send one record of this MLflow run (or spool it). Never raises."""
        if self.run_id is None or self._sender is None:
            return
        self._sender.send({"run_id": self.run_id, "tracking_uri": redact_url(self._uri), **record})
