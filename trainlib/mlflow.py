"""MLflow tracking for trainlib runs: ``MLflowLogger`` and ``log_model``. Runs on the driver only.

``MLflowLogger`` is a driver-side :class:`trainlib.Callback`, so a run has one
MLflow run whatever its world size. It logs the run's configuration as params,
every report's metrics at the report's step, checkpoints as artifacts (or only
their URIs), and ends the MLflow run FINISHED or FAILED like ``fit()``. A
restart after a worker failure and a resume of the same trainlib run continue
the same MLflow run: its id is kept in the run folder's ``trainlib_run.json``.

A tracking outage never costs the training: every MLflow call is bounded in
time, what cannot be sent is written to a local spool file, the logger says
exactly what was not logged, and :meth:`MLflowLogger.replay_spool` sends it later.

Example:
    >>> from trainlib.mlflow import MLflowLogger, log_model
    >>> logger = MLflowLogger(experiment_name="fashion-mnist")
    >>> result = TorchTrainer(train_func, run_config=trainlib.RunConfig(callbacks=[logger])).fit()
    >>> info = log_model(result.checkpoint, Net(), input_example=x[:4], registered_model_name="fashion")

``import trainlib`` does not import mlflow; this module does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import posixpath
import re
import time
from typing import TYPE_CHECKING, Any, Iterator

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from trainlib._internal import tunables
from trainlib._internal.callbacks import Callback, ReportRecord, RunInfo
from trainlib._internal.checkpoint import Checkpoint
from trainlib._internal.errors import TrainlibError
from trainlib._internal.storage import RUN_STATE_FILE, is_local_filesystem
from trainlib._internal.tracking import (
    Spool,
    describe_records,
    params_for_logging,
    redact_text,
    redact_url,
    truncate,
)

if TYPE_CHECKING:
    from trainlib._internal.errors import WorkerError
    from trainlib._internal.result import Result

logger = logging.getLogger("trainlib")

DEFAULT_EXPERIMENT_NAME = "trainlib"
LOG_CHECKPOINTS_CHOICES = ("all", "best", "last", "uri")
CHECKPOINT_ARTIFACT_DIR = "checkpoints"
SPOOL_FILE = "mlflow_spool.jsonl"
STATE_KEY = "mlflow"

# MLflow's limits on one run's entries (mlflow.utils.validation); read from MLflow when it has them.
try:
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH
except ImportError:  # pragma: no cover - older or newer MLflow without these names
    MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH = 250, 6000, 8000
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000

# MLflow errors that a retry cannot fix: the call is reported as rejected, not spooled.
_REJECTED_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS",
                   "BAD_REQUEST", "INVALID_STATE"}


class TrackingError(TrainlibError):
    """MLflow tracking could not start (server unreachable, bad URI, bad experiment)."""


@dataclasses.dataclass(frozen=True)
class SpoolReplay:
    """The outcome of :meth:`MLflowLogger.replay_spool`.

    Attributes:
        path: the spool file.
        sent: records sent to MLflow now.
        remaining: records still in the spool (the server is still unreachable).
        rejected: records MLflow refused for good, each described in a line.
    """

    path: str
    sent: int
    remaining: int
    rejected: tuple[str, ...] = ()


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the embedded store ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(os.getcwd(), 'mlflow.db')}"


def _sqlite_artifact_root(tracking_uri: str) -> str | None:
    """``<db folder>/mlartifacts`` for a local SQLite store (the folder ``mlflow server`` uses too)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db_path = tracking_uri[len("sqlite:///"):]
    return os.path.join(os.path.dirname(os.path.abspath(db_path)), "mlartifacts")


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """Bound MLflow's HTTP retries and timeout for the logger's own calls (unless the user set them)."""
    limits = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": tunables.MLFLOW_HTTP_MAX_RETRIES,
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": tunables.MLFLOW_HTTP_BACKOFF_FACTOR,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": tunables.MLFLOW_HTTP_TIMEOUT_S,
    }
    added = [name for name in limits if name not in os.environ]
    for name in added:
        os.environ[name] = str(limits[name])
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _is_rejected(exc: BaseException) -> bool:
    return isinstance(exc, MlflowException) and exc.error_code in _REJECTED_CODES


def _short_error(exc: BaseException) -> str:
    return truncate(redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0]), 300)


def _version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _trainlib_version() -> str:
    from trainlib import __version__

    return __version__


# -- sending one record ----------------------------------------------------------------------

def _perform(client: MlflowClient, record: dict[str, Any]) -> None:
    """Send one tracking record (the same code path live and when replaying the spool)."""
    run_id, kind = record["run_id"], record["kind"]
    if kind == "metrics":
        metrics = [Metric(key, float(value), int(record["timestamp"]), int(record["step"]))
                   for key, value in record["metrics"].items()]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[i:i + _METRICS_PER_BATCH], synchronous=True)
    elif kind == "params":
        params = [Param(k, v) for k, v in record["params"].items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[i:i + _PARAMS_PER_BATCH], synchronous=True)
    elif kind == "tags":
        tags = [RunTag(k, v) for k, v in record["tags"].items()]
        for i in range(0, len(tags), _PARAMS_PER_BATCH):
            client.log_batch(run_id, tags=tags[i:i + _PARAMS_PER_BATCH], synchronous=True)
    elif kind == "artifacts":
        checkpoint = record.get("_checkpoint") or Checkpoint.from_uri(record["source"])
        if not checkpoint.filesystem.exists(checkpoint.path):
            raise MlflowException(
                f"checkpoint {record['source']} no longer exists (deleted by retention?)",
                error_code="RESOURCE_DOES_NOT_EXIST",
            )
        with checkpoint.as_directory() as folder:
            client.log_artifacts(run_id, folder, record["artifact_path"])
    elif kind == "status":
        client.set_terminated(run_id, record["status"], end_time=int(record["end_time"]))
    else:
        raise MlflowException(f"unknown spool record kind {kind!r}", error_code="BAD_REQUEST")


def _spoolable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("_")}


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

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None,
                 run_name: str | None = None, tags: dict[str, Any] | None = None,
                 log_checkpoints: str = "all", *, spool_dir: str | os.PathLike | None = None):
        if tracking_uri is not None and (not isinstance(tracking_uri, str) or not tracking_uri):
            raise TypeError(
                f"MLflowLogger(tracking_uri={tracking_uri!r}) must be a URI string such as "
                "'http://127.0.0.1:5000' or 'sqlite:///mlflow.db', or None for the default."
            )
        if experiment_name is not None and (not isinstance(experiment_name, str) or not experiment_name.strip()):
            raise ValueError(
                f"MLflowLogger(experiment_name={experiment_name!r}) must be a non-empty string, e.g. "
                "'fashion-mnist', or None for the default 'trainlib'."
            )
        if run_name is not None and not isinstance(run_name, str):
            raise TypeError(f"MLflowLogger(run_name={run_name!r}) must be a string or None.")
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLflowLogger(tags={tags!r}) must be a dict of tag name -> value.")
        if log_checkpoints not in LOG_CHECKPOINTS_CHOICES:
            raise ValueError(
                f"MLflowLogger(log_checkpoints={log_checkpoints!r}) is invalid: use one of "
                f"{', '.join(repr(c) for c in LOG_CHECKPOINTS_CHOICES)} ('uri' records the checkpoints' "
                "storage URIs without copying them)."
            )
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
        self._spool: Spool | None = None
        self._offline_since: float | None = None
        self._last_probe = 0.0
        self._failures = 0

    def __getstate__(self) -> dict[str, Any]:
        # The trainer may pickle its config; a live client is not needed elsewhere.
        state = self.__dict__.copy()
        state["_client"] = None
        state["_spool"] = None
        return state

    # -- hooks -------------------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        self._uri = self.tracking_uri or default_tracking_uri()
        self._client = MlflowClient(tracking_uri=self._uri)
        self._offline_since = None
        self._failures = 0
        saved = (run.state.get("callbacks") or {}).get(STATE_KEY) or {}
        self._spool = Spool(self._spool_file(run))
        self.spool_path = self._spool.path
        try:
            with _bounded_http():
                self.experiment_id = self._experiment_id()
                if len(self._spool):
                    # An earlier outage left records behind (an old end status among them):
                    # send them before this run reopens the MLflow run.
                    self._replay_own_spool()
                self.run_id = self._open_run(run, saved)
        except TrackingError:
            raise
        except Exception as exc:  # noqa: BLE001 - every cause becomes one clear error
            raise TrackingError(
                f"MLflowLogger cannot reach the MLflow tracking store at {redact_url(self._uri)} "
                f"({_short_error(exc)}). Nothing was started. Start the server (e.g. `mlflow server "
                "--host 127.0.0.1 --port 5000`), or point MLflowLogger(tracking_uri=...) / "
                "MLFLOW_TRACKING_URI at a reachable one, or remove MLflowLogger from RunConfig.callbacks "
                "to train without tracking."
            ) from None
        run.state.setdefault("callbacks", {})[STATE_KEY] = {
            "run_id": self.run_id, "experiment_id": self.experiment_id,
            "tracking_uri": redact_url(self._uri),
        }
        logger.info("MLflow run %s in experiment %r at %s", self.run_id, self._experiment_name(),
                    redact_url(self._uri))

    def after_report(self, run: RunInfo, report: ReportRecord) -> None:
        metrics = {k: v for k, v in report.metrics.items() if isinstance(v, (int, float))}
        if metrics:
            self._emit({"kind": "metrics", "step": report.step, "metrics": metrics,
                        "timestamp": int(report.reported_at * 1000)})
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
            self._emit({"kind": "tags", "tags": {
                f"trainlib.checkpoint.{name}": truncate(f"deleted by retention: {checkpoint.uri}",
                                                        MAX_TAG_VAL_LENGTH)}})

    def after_failure(self, run: RunInfo, failure: "WorkerError", will_restart: bool) -> None:
        self._failures += 1
        self._emit({"kind": "tags", "tags": {
            "trainlib.failures": str(self._failures),
            "trainlib.last_failure": truncate(redact_text(f"rank {failure.rank}: {failure.cause}"),
                                              MAX_TAG_VAL_LENGTH),
        }})

    def after_run(self, run: RunInfo, result: "Result") -> None:
        if self.run_id is None:
            return
        if self._offline_since is None and self._spool is not None and len(self._spool):
            self._replay_own_spool()  # older records first, so the end status below is the last word
        if self.log_checkpoints in ("best", "last"):
            chosen = result.checkpoint
            if self.log_checkpoints == "best" and result.best_checkpoints:
                chosen = result.best_checkpoints[0][0]
            if chosen is not None:
                self._emit({"kind": "tags", "tags": {f"trainlib.{self.log_checkpoints}_checkpoint": chosen.uri}})
                self._emit_checkpoint(chosen)
        failed = result.error is not None or run.state.get("status") == "FAILED"
        if failed:
            message = run.state.get("error") or f"{type(result.error).__name__}: {result.error}"
            self._emit({"kind": "tags", "tags": {
                "trainlib.error": truncate(redact_text(message), MAX_TAG_VAL_LENGTH)}})
        status = "FAILED" if failed else "FINISHED"
        self._emit({"kind": "status", "status": status, "end_time": int(time.time() * 1000)})
        if self._spool is not None and len(self._spool):
            self._replay_own_spool()
        if self._spool is not None and len(self._spool):
            missing = describe_records([r for r in self._spool.read() if r["run_id"] == self.run_id])
            logger.warning(
                "MLflow run %s at %s is missing %s: the tracking server could not be reached. The records "
                "are spooled in %s; send them with trainlib.mlflow.MLflowLogger.replay_spool(%r) once the "
                "server is back (resuming this trainlib run also sends them). Checkpoints in run "
                "storage are intact.", self.run_id, redact_url(self._uri), missing, self._spool.path,
                self._spool.path,
            )
        else:
            logger.info("MLflow run %s ended %s", self.run_id, status)

    # -- replay --------------------------------------------------------------------------

    @classmethod
    def replay_spool(cls, path: str | os.PathLike, tracking_uri: str | None = None) -> SpoolReplay:
        """Send the records spooled at ``path`` to MLflow, oldest first.

        Records that still cannot be sent stay in the file, so a replay can be
        repeated; records MLflow rejects for good are dropped and listed in the
        result (and logged). The file is deleted once it is empty.

        Args:
            path: the spool file (``logger.spool_path``, named in the warning).
            tracking_uri: where to send; default the URI each record was made
                for (give it when that URI held a password, which is never spooled).

        Example:
            >>> MLflowLogger.replay_spool("/runs/fashion/mlflow_spool.jsonl")
            SpoolReplay(path=..., sent=12, remaining=0, rejected=())
        """
        spool = Spool(os.fspath(path))
        records = spool.read()
        clients: dict[str, MlflowClient] = {}
        sent, rejected, left = 0, [], []
        with _bounded_http():
            for i, record in enumerate(records):
                uri = tracking_uri or record["tracking_uri"]
                client = clients.setdefault(uri, MlflowClient(tracking_uri=uri))
                try:
                    _perform(client, record)
                    sent += 1
                except Exception as exc:  # noqa: BLE001 - sorted into rejected / still pending
                    if _is_rejected(exc):
                        line = f"{describe_records([record])} of run {record['run_id']}: {_short_error(exc)}"
                        logger.warning("MLflow rejected a spooled record, dropped it: %s", line)
                        rejected.append(line)
                        continue
                    left = records[i:]  # keep order: everything from the first failure stays
                    break
        spool.rewrite(left)
        return SpoolReplay(path=spool.path, sent=sent, remaining=len(left), rejected=tuple(rejected))

    # -- internals -------------------------------------------------------------------------

    def _experiment_name(self) -> str:
        return self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT_NAME

    def _experiment_id(self) -> str:
        name = self._experiment_name()
        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"MLflow experiment {name!r} at {redact_url(self._uri)} is deleted: restore it "
                    f"(`mlflow experiments restore --experiment-id {experiment.experiment_id}`) or pass "
                    "another MLflowLogger(experiment_name=...)."
                )
            return experiment.experiment_id
        root = _sqlite_artifact_root(self._uri)
        location = os.path.join(root, re.sub(r"[^A-Za-z0-9._-]+", "_", name)) if root else None
        try:
            return self._client.create_experiment(name, artifact_location=location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self._client.get_experiment_by_name(name).experiment_id  # created concurrently

    def _open_run(self, run: RunInfo, saved: dict[str, Any]) -> str:
        params = params_for_logging(
            {"": run.train_loop_config, "scaling_config": run.scaling_config,
             "checkpoint_config": run.state.get("checkpoint_config"),
             "failure_config": run.state.get("failure_config")},
            MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH,
        )
        tags = {
            "trainlib.run_name": run.name,
            "trainlib.storage_path": redact_url(run.path),
            "trainlib.world_size": str(run.world_size),
            "trainlib.device_type": "cuda" if run.use_gpu else "cpu",
            "trainlib.torch_version": _version_of("torch"),
            "trainlib.version": _trainlib_version(),
            "trainlib.log_checkpoints": self.log_checkpoints,
            **{str(k): truncate(redact_text(str(v)), MAX_TAG_VAL_LENGTH) for k, v in self.tags.items()},
        }
        previous = self._previous_run(saved)
        if previous is not None:
            run_id = previous.info.run_id
            self._client.update_run(run_id, status="RUNNING")
            old = previous.data.params
            changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
            if changed:
                logger.warning(
                    "MLflow params are immutable: run %s keeps its first values of %s; the resumed run's "
                    "new values are in trainlib_run.json.", run_id, ", ".join(changed))
            params = {k: v for k, v in params.items() if k not in old}
            tags["trainlib.resumed"] = str(int(previous.data.tags.get("trainlib.resumed", "0")) + 1)
            if run.resumed_from:
                tags["trainlib.resumed_from"] = run.resumed_from
            logger.info("MLflow: continuing run %s of trainlib run %s", run_id, run.name)
        else:
            created = self._client.create_run(self.experiment_id, run_name=self.run_name or run.name)
            run_id = created.info.run_id
        if params:
            _perform(self._client, {"run_id": run_id, "kind": "params", "params": params})
        _perform(self._client, {"run_id": run_id, "kind": "tags", "tags": tags})
        return run_id

    def _previous_run(self, saved: dict[str, Any]) -> Any:
        run_id = saved.get("run_id")
        if not run_id:
            return None
        try:
            previous = self._client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            logger.warning("MLflow run %s of this trainlib run is not in %s: starting a new MLflow run.",
                           run_id, redact_url(self._uri))
            return None
        if previous.info.lifecycle_stage == "deleted":
            logger.warning("MLflow run %s of this trainlib run was deleted: starting a new MLflow run.", run_id)
            return None
        return previous

    def _spool_file(self, run: RunInfo) -> str:
        if self.spool_dir is not None:
            return os.path.join(self.spool_dir, f"{run.name}.{SPOOL_FILE}")
        if "://" not in run.path or run.path.startswith("file://"):
            local = run.path[len("file://"):] if run.path.startswith("file://") else run.path
            return os.path.join(local, SPOOL_FILE)
        return os.path.join(os.path.expanduser("~/.trainlib/mlflow_spool"), f"{run.name}.{SPOOL_FILE}")

    def _emit_checkpoint(self, checkpoint: Checkpoint) -> None:
        name = posixpath.basename(checkpoint.path.rstrip("/"))
        self._emit({"kind": "artifacts", "source": checkpoint.uri,
                    "artifact_path": f"{CHECKPOINT_ARTIFACT_DIR}/{name}", "_checkpoint": checkpoint})

    def _emit(self, record: dict[str, Any]) -> None:
        """Send one record now, or spool it when the tracking store is unreachable. Never raises."""
        if self.run_id is None or self._client is None:
            return
        record = {"run_id": self.run_id, "tracking_uri": redact_url(self._uri), **record}
        if self._offline_since is not None:
            if time.monotonic() - self._last_probe < tunables.MLFLOW_RECONNECT_INTERVAL_S:
                self._spool.append(_spoolable(record))
                return
            self._last_probe = time.monotonic()
            if not self._replay_own_spool():
                self._spool.append(_spoolable(record))
                return
        try:
            with _bounded_http():
                _perform(self._client, record)
        except Exception as exc:  # noqa: BLE001 - tracking never fails training
            if _is_rejected(exc):
                logger.warning("MLflow rejected %s for run %s, not logged: %s", describe_records([record]),
                               self.run_id, _short_error(exc))
                return
            self._spool.append(_spoolable(record))
            self._offline_since = self._last_probe = time.monotonic()
            logger.warning(
                "MLflow tracking at %s failed (%s) while logging %s. Training goes on; what cannot be sent "
                "is spooled to %s and retried every %.0f s.", redact_url(self._uri), _short_error(exc),
                describe_records([record]), self._spool.path, tunables.MLFLOW_RECONNECT_INTERVAL_S,
            )

    def _replay_own_spool(self) -> bool:
        """Try to send the spool; True when it is empty afterwards (back online)."""
        replay = MLflowLogger.replay_spool(self._spool.path, tracking_uri=self._uri)
        if replay.remaining:
            return False
        if self._offline_since is not None or replay.sent:
            logger.warning("MLflow tracking at %s answers again: sent %d spooled record(s) from %s.",
                           redact_url(self._uri), replay.sent, self._spool.path)
        self._offline_since = None
        return True


# -- the model ---------------------------------------------------------------------------------

def log_model(checkpoint: Checkpoint, model: Any, *, state_dict_file: str = "model.pt",
              state_dict_key: str | None = None, input_example: Any = None,
              registered_model_name: str | None = None, run_id: str | None = None,
              tracking_uri: str | None = None, artifact_path: str = "model") -> Any:
    """Load a checkpoint's weights into ``model`` and log it to MLflow (optionally registering it).

    The state dict is read from ``state_dict_file`` in the checkpoint (or from
    ``obj[state_dict_key]`` when the file holds a dict of several things); a DDP
    ``module.`` prefix is stripped, so pass the plain, unwrapped model. With an
    ``input_example`` the model's signature is inferred from it and the model's
    output on it.

    Args:
        checkpoint: a trainlib checkpoint, e.g. ``result.checkpoint``.
        model: a ``torch.nn.Module`` of the trained architecture.
        state_dict_file: the file in the checkpoint holding the state dict.
        state_dict_key: the key of the state dict when the file holds a dict of several objects.
        input_example: a batch (tensor or numpy array) for the signature and example.
        registered_model_name: also register the model under this name (a new version).
        run_id: the MLflow run to log into. Default: the run that ``MLflowLogger``
            recorded for the checkpoint's trainlib run, else the active MLflow run.
        tracking_uri: default: the URI recorded with that run, else ``MLFLOW_TRACKING_URI``,
            else the embedded ``sqlite:///<cwd>/mlflow.db``.
        artifact_path: the logged model's name.

    Returns:
        ``mlflow.models.model.ModelInfo``; ``info.model_uri`` loads it back and,
        when registered, ``info.registered_model_version`` is the new version.

    Raises:
        FileNotFoundError: the checkpoint has no ``state_dict_file``.
        ValueError: no MLflow run to log into, or the weights do not fit ``model``.

    Example:
        >>> info = log_model(result.checkpoint, Net(), input_example=images[:8],
        ...                  registered_model_name="fashion-mnist")
        >>> mlflow.pytorch.load_model(info.model_uri)
    """
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"log_model(checkpoint=...) takes a trainlib.Checkpoint (e.g. result.checkpoint), "
                        f"got {type(checkpoint).__name__}.")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"log_model(model=...) takes a torch.nn.Module, got {type(model).__name__}.")
    recorded = _recorded_run(checkpoint)
    if run_id is None and recorded.get("run_id"):
        run_id = recorded["run_id"]
        if tracking_uri is None and "[REDACTED]" not in recorded.get("tracking_uri", "[REDACTED]"):
            tracking_uri = recorded["tracking_uri"]
    tracking_uri = tracking_uri or default_tracking_uri()

    state = _load_state_dict(checkpoint, state_dict_file, state_dict_key)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"log_model: the weights in {checkpoint.uri}/{state_dict_file} do not fit {type(model).__name__}: "
            f"{str(exc).splitlines()[0]} ... Pass a model of the architecture that was trained."
        ) from exc
    model.eval()

    signature, example = None, None
    if input_example is not None:
        example_tensor = input_example if isinstance(input_example, torch.Tensor) else torch.as_tensor(input_example)
        with torch.no_grad():
            output = model(example_tensor)
        example = example_tensor.detach().cpu().numpy()
        signature = infer_signature(example, output.detach().cpu().numpy())

    with _using_tracking_uri(tracking_uri):
        active = mlflow.active_run()
        if run_id is None and active is None:
            raise ValueError(
                "log_model: no MLflow run to log into: the checkpoint's trainlib run has no MLflowLogger "
                "record and no MLflow run is active. Pass run_id=... (e.g. logger.run_id), or call it "
                "inside `with mlflow.start_run():`."
            )
        if run_id is None or (active is not None and active.info.run_id == run_id):
            return mlflow.pytorch.log_model(model, name=artifact_path, signature=signature,
                                            input_example=example, registered_model_name=registered_model_name)
        client = MlflowClient(tracking_uri=tracking_uri)
        before = client.get_run(run_id).info
        with mlflow.start_run(run_id=run_id, nested=active is not None):
            info = mlflow.pytorch.log_model(model, name=artifact_path, signature=signature,
                                            input_example=example, registered_model_name=registered_model_name)
        if before.status != "RUNNING":
            # Keep the training run's own end state and end time (FAILED stays FAILED).
            client.set_terminated(run_id, before.status, end_time=before.end_time)
        return info


@contextlib.contextmanager
def _using_tracking_uri(uri: str) -> Iterator[None]:
    """Use ``uri`` as MLflow's tracking URI inside the block; restore the caller's setting after."""
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def _recorded_run(checkpoint: Checkpoint) -> dict[str, Any]:
    """What MLflowLogger recorded in the checkpoint's trainlib run folder (``{}`` when nothing)."""
    run_dir = posixpath.dirname(checkpoint.path.rstrip("/"))
    state_file = posixpath.join(run_dir, RUN_STATE_FILE)
    if not is_local_filesystem(checkpoint.filesystem):
        state_file = checkpoint.filesystem._strip_protocol(state_file)
    try:
        state = json.loads(checkpoint.filesystem.cat_file(state_file))
    except (FileNotFoundError, ValueError, OSError):
        return {}
    return (state.get("callbacks") or {}).get(STATE_KEY) or {}


def _load_state_dict(checkpoint: Checkpoint, state_dict_file: str, state_dict_key: str | None) -> dict[str, Any]:
    import torch

    path = posixpath.join(checkpoint.path.rstrip("/"), state_dict_file)
    if not checkpoint.filesystem.exists(path):
        try:
            present = sorted(posixpath.basename(p) for p in checkpoint.filesystem.ls(checkpoint.path, detail=False))
        except OSError:
            present = []
        raise FileNotFoundError(
            f"log_model: checkpoint {checkpoint.uri} has no {state_dict_file!r} (it holds {present}). "
            "Pass state_dict_file= the file your training function saved with torch.save(model.state_dict(), ...)."
        )
    with checkpoint.filesystem.open(path, "rb") as f:
        obj = torch.load(f, map_location="cpu", weights_only=True)
    if state_dict_key is not None:
        if not isinstance(obj, dict) or state_dict_key not in obj:
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"log_model(state_dict_key={state_dict_key!r}): {state_dict_file} holds {keys}; "
                             "pass one of those keys.")
        obj = obj[state_dict_key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        keys = sorted(obj)[:10] if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(
            f"log_model: {state_dict_file} in {checkpoint.uri} is not a state dict of tensors (it holds {keys}). "
            "If it bundles several objects, pass state_dict_key='model' (the key of the model's state dict)."
        )
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}  # saved from the DDP wrapper
    return obj


__all__ = ["MLflowLogger", "SpoolReplay", "TrackingError", "default_tracking_uri", "log_model"]
