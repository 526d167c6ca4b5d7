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
(``_sender.py``). Opening the MLflow run is in ``_run.py``; a resumed run's missing metrics, ``_backfill.py``.

This module does not import mlflow: ``before_run`` does (~1-1.5 s of CPU), so building the logger costs
nothing and the import runs while ``fit()`` starts its workers, whose actors were asked for first.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from typing import TYPE_CHECKING, Any

from trainlib._internal.metrics import is_number
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.tracking.params import truncate
from trainlib._internal.tracking.spool import Spool, describe_records, spool_file
from trainlib._internal.util.masking import redact_text, redact_url
from trainlib.callbacks import Callback, ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.mlflow._arguments import DEFAULT_EXPERIMENT_NAME, check_logger_arguments
from trainlib.mlflow._backfill import missing_metrics_records
from trainlib.mlflow._store import STATE_KEY, bounded_http, default_tracking_uri, probe_tracking_server
from trainlib.mlflow.errors import TrackingError, short_error

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from trainlib.errors import WorkerError
    from trainlib.mlflow._sender import RecordSender
    from trainlib.mlflow._spool import SpoolReplay
    from trainlib.result import Result

logger = logging.getLogger("trainlib")

CHECKPOINT_ARTIFACT_DIR = "checkpoints"


def _tag_value(text: str) -> str:
    """``text`` cut to MLflow's longest tag value (read from mlflow, which ``before_run`` imported)."""
    from trainlib.mlflow._records import MAX_TAG_VAL_LENGTH

    return truncate(text, MAX_TAG_VAL_LENGTH)


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

        from trainlib.mlflow._run import experiment_id, open_run
        from trainlib.mlflow._sender import RecordSender

        self._client = MlflowClient(tracking_uri=self._uri)
        self._failures = 0
        saved, self._saved = self._saved, {}
        self._sender = RecordSender(self._client, self._uri, Spool(spool_file(run.name, run.path, self.spool_dir)))
        self.spool_path = self._sender.spool.path
        try:
            with bounded_http():
                self.experiment_id = experiment_id(self._client, self._uri, self._experiment_name())
                if self._sender.pending():
                    # An earlier outage left records behind (an old end status among them):
                    # send them before this run reopens the MLflow run.
                    self._sender.replay()
                self.run_id = open_run(
                    self._client,
                    self._uri,
                    self.experiment_id,
                    run,
                    saved,
                    run_name=self.run_name,
                    log_checkpoints=self.log_checkpoints,
                    tags=self.tags,
                )
        except TrackingError:
            raise
        except Exception as exc:  # noqa: BLE001 - every cause becomes one clear error
            raise TrackingError(
                f"MLflowLogger cannot reach the MLflow tracking store at {redact_url(self._uri)} "
                f"({short_error(exc)}). Nothing was started. Start the server (e.g. `mlflow server "
                "--host 127.0.0.1 --port 5000`), or point MLflowLogger(tracking_uri=...) / "
                "MLFLOW_TRACKING_URI at a reachable one, or remove MLflowLogger from RunConfig.callbacks "
                "to train without tracking."
            ) from None
        logger.info("MLflow run %s in experiment %r at %s", self.run_id, self._experiment_name(), redact_url(self._uri))
        if saved.get("run_id") == self.run_id and run.earlier_reports:
            for record in missing_metrics_records(self._client, self.run_id, run.earlier_reports):
                self._emit(record)

    def after_report(self, run: RunInfo, report: ReportRecord) -> None:
        metrics = {k: v for k, v in report.metrics.items() if is_number(v)}
        skipped = sorted(set(report.metrics) - set(metrics) - self._skipped_keys)
        if skipped:  # strings, lists, objects: kept in the run's metrics, but MLflow metrics are numbers
            self._skipped_keys.update(skipped)
            logger.warning(
                "MLflow logs only numeric metrics: %s (reported from step %d on) not logged to MLflow; "
                "they are kept in Result.metrics and metrics_dataframe.",
                ", ".join(skipped),
                report.step,
            )
        if metrics:
            self._emit(
                {
                    "kind": "metrics",
                    "step": report.step,
                    "metrics": metrics,
                    "timestamp": int(report.reported_at * 1000),
                }
            )
        if report.checkpoint is None:
            return
        name = posixpath.basename(report.checkpoint.path.rstrip("/"))
        tags = {"trainlib.latest_checkpoint": report.checkpoint.uri}
        if self.log_checkpoints == "uri":
            tags[f"trainlib.checkpoint.{name}"] = report.checkpoint.uri
        self._emit({"kind": "tags", "tags": tags})
        if self.log_checkpoints == "all":
            self._emit_checkpoint(report.checkpoint)

    def after_checkpoint_deleted(self, run: RunInfo, checkpoint: Checkpoint) -> None:
        if self.log_checkpoints == "uri":
            name = posixpath.basename(checkpoint.path.rstrip("/"))
            self._emit(
                {
                    "kind": "tags",
                    "tags": {f"trainlib.checkpoint.{name}": _tag_value(f"deleted by retention: {checkpoint.uri}")},
                }
            )

    def after_failure(self, run: RunInfo, failure: WorkerError, will_restart: bool) -> None:
        self._failures += 1
        self._emit(
            {
                "kind": "tags",
                "tags": {
                    "trainlib.failures": str(self._failures),
                    "trainlib.last_failure": _tag_value(redact_text(f"rank {failure.rank}: {failure.cause}")),
                },
            }
        )

    def after_run(self, run: RunInfo, result: Result) -> None:
        if self.run_id is None or self._sender is None:
            return
        sender = self._sender
        if sender.offline_since is None and sender.pending():
            sender.replay()  # older records first, so the end status below is the last word
        if self.log_checkpoints in ("best", "last"):
            chosen = result.checkpoint
            if self.log_checkpoints == "best" and result.best_checkpoints:
                chosen = result.best_checkpoints[-1][0]  # Ray Train's order: best last
            if chosen is not None:
                self._emit({"kind": "tags", "tags": {f"trainlib.{self.log_checkpoints}_checkpoint": chosen.uri}})
                self._emit_checkpoint(chosen)
        failed = result.error is not None or run.record.status is RunStatus.FAILED
        if failed:
            message = run.record.error or f"{type(result.error).__name__}: {result.error}"
            self._emit({"kind": "tags", "tags": {"trainlib.error": _tag_value(redact_text(message))}})
        status = "FAILED" if failed else "FINISHED"
        self._emit({"kind": "status", "status": status, "end_time": int(time.time() * 1000)})
        if sender.pending():
            sender.replay()
        if sender.pending():
            missing = describe_records([r for r in sender.spool.read() if r["run_id"] == self.run_id])
            logger.warning(
                "MLflow run %s at %s is missing %s: the tracking server could not be reached. The records "
                "are spooled in %s; send them with trainlib.mlflow.MLflowLogger.replay_spool(%r) once the "
                "server is back (resuming this trainlib run also sends them). Checkpoints in run "
                "storage are intact.",
                self.run_id,
                redact_url(self._uri),
                missing,
                sender.spool.path,
                sender.spool.path,
            )
        else:
            logger.info("MLflow run %s ended %s", self.run_id, status)

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

    def _emit_checkpoint(self, checkpoint: Checkpoint) -> None:
        name = posixpath.basename(checkpoint.path.rstrip("/"))
        self._emit(
            {
                "kind": "artifacts",
                "source": checkpoint.uri,
                "artifact_path": f"{CHECKPOINT_ARTIFACT_DIR}/{name}",
                "_checkpoint": checkpoint,
            }
        )

    def _emit(self, record: dict[str, Any]) -> None:
        """Send one record of this MLflow run (or spool it). Never raises."""
        if self.run_id is None or self._sender is None:
            return
        self._sender.send({"run_id": self.run_id, "tracking_uri": redact_url(self._uri), **record})
