"""``Result``: what ``fit()`` returns, and what ``Result.from_path`` reads back. Driver only."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import fsspec

from trainlib._internal.metrics import lookup_metric
from trainlib._internal.storage.retention import best_checkpoints
from trainlib._internal.storage.run_record import RunRecord, RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig
from trainlib.errors import TrainingFailedError


class _PyarrowFilesystem:
    """``Result.filesystem``: the pyarrow filesystem made on first use from the storage's (importing pyarrow takes
    a moment that a ``fit()`` whose caller never looks should not pay), or the one set."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_{name}_value"

    def __get__(self, result: Any, owner: type | None = None) -> Any:
        if result is None:  # the dataclass's default for the field
            return None
        value = result.__dict__.get(self._key)
        if value is None and result._fs is not None:
            from trainlib._internal.util.filesystem import as_pyarrow

            value = result.__dict__[self._key] = as_pyarrow(result._fs)
        return value

    def __set__(self, result: Any, value: Any) -> None:
        result.__dict__[self._key] = value


@dataclasses.dataclass
class Result:
    """The outcome of a training run.

    Attributes:
        metrics: rank 0's last reported metrics.
        checkpoint: the latest committed checkpoint, or None.
        path: the run's folder as a path inside ``filesystem``, as Ray Train gives it: without the
            URL's scheme for remote storage (``bucket/runs/run``). :attr:`uri` is the folder as one URL.
        error: the exception that ended the run, or None if it finished.
        metrics_dataframe: every report as a row (the metrics, then ``step``, ``attempt``,
            ``timestamp`` and ``checkpoint``), or None. A metric reported under one of
            those four names keeps its reported value.
        best_checkpoints: the ``num_to_keep`` best checkpoints as ``(Checkpoint, metrics)``,
            in Ray Train's order: by ``checkpoint_score_attribute``, best last,
            or in report order without one. The latest checkpoint that an
            unfinished run keeps for resuming is not among them unless it is one of the best.
        filesystem: the ``pyarrow.fs.FileSystem`` of ``path``, as Ray Train gives it: the one given as
            ``storage_filesystem`` when that is a pyarrow one, else the storage's (``LocalFileSystem`` on local
            disk, pyarrow's own from a URL with query parameters, else ``PyFileSystem(FSSpecHandler(fs))``).
        return_value: what the training function returned on rank 0, or None (it returned
            nothing, the run failed, or the Result was read back with ``from_path``: the value
            is not stored in the run folder, as in Ray Train).

    Example:
        >>> result = trainer.fit()
        >>> result.metrics["loss"], result.checkpoint
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    path: str
    error: BaseException | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = dataclasses.field(default_factory=list)
    filesystem: Any = _PyarrowFilesystem()  # a descriptor-typed field: its default is None
    return_value: Any = dataclasses.field(default=None, repr=False)
    # The metrics log's rows; the DataFrame is built from them on first use, so fit() does
    # not import pandas (~0.5 s, ~70 MB) for a caller that never looks.
    _metrics_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    _uri: str | None = dataclasses.field(default=None, repr=False)
    _fs: Any = dataclasses.field(default=None, repr=False)  # trainlib's fsspec filesystem of the storage

    @property
    def uri(self) -> str:
        """The run's folder as one URL (``s3://bucket/runs/run``, with the storage URL's query parameters; a plain
        path on local disk), which ``Result.from_path`` reads back without a ``storage_filesystem``."""
        return self._uri or self.path

    @property
    def metrics_dataframe(self) -> Any:
        """Every report as a row of a pandas DataFrame, or None when nothing was reported."""
        if not self._metrics_rows:
            return None
        if "_dataframe" not in self.__dict__:
            import pandas as pd

            self.__dict__["_dataframe"] = pd.DataFrame([_dataframe_row(r) for r in self._metrics_rows])
        return self.__dict__["_dataframe"]

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The checkpoint of ``best_checkpoints`` with the highest (``mode="max"``) or lowest (``"min"``) ``metric``,
        as in Ray Train; checkpoints reported without the metric are skipped. ``metric`` may be a ``/`` path into
        nested metrics (``"val/loss"``).

        Raises:
            RuntimeError: the run kept no checkpoint, or none of them has ``metric``.
            ValueError: ``mode`` is neither ``"min"`` nor ``"max"``.
        """
        if mode not in ("min", "max"):
            raise ValueError(f"Result.get_best_checkpoint(mode={mode!r}) is invalid: use mode='min' or mode='max'.")
        if not self.best_checkpoints:
            raise RuntimeError(
                f"Result.get_best_checkpoint(): the run at {self.uri} kept no checkpoint: report one "
                "with trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))."
            )
        scored = [
            (checkpoint, value)
            for checkpoint, metrics in self.best_checkpoints
            if (value := lookup_metric(metrics, metric)) is not None
        ]
        if not scored:
            reported = sorted({name for _, metrics in self.best_checkpoints for name in metrics})
            raise RuntimeError(
                f"Result.get_best_checkpoint(metric={metric!r}): no checkpoint was reported with that "
                f"metric. The checkpoints' metrics are: {reported}."
            )
        choose = max if mode == "max" else min
        return choose(scored, key=lambda pair: pair[1])[0]

    def __repr__(self) -> str:
        error = f", error={type(self.error).__name__}" if self.error else ""
        return f"Result(metrics={self.metrics}, checkpoint={self.checkpoint}, path={self.path!r}{error})"

    @classmethod
    def from_storage(
        cls,
        storage: RunStorage,
        checkpoint_config: CheckpointConfig,
        error: BaseException | None = None,
        filesystem: Any = None,
    ) -> Result:
        # Commit order can differ from step order when a dead rank's reports are recovered late.
        rows = sorted(storage.read_metrics_log(), key=lambda r: (int(r.get("attempt", 0)), int(r["step"])))
        committed = storage.committed_checkpoints()
        latest = committed[-1] if committed else None
        best = best_checkpoints(committed, checkpoint_config)
        return cls(
            metrics=rows[-1]["metrics"] if rows else None,
            checkpoint=Checkpoint(latest.path, storage.fs) if latest else None,
            path=storage.run_path,
            error=error,
            _metrics_rows=rows,
            best_checkpoints=[(Checkpoint(c.path, storage.fs), c.metrics) for c in best],
            filesystem=filesystem
            if filesystem is not None and not isinstance(filesystem, fsspec.AbstractFileSystem)
            else None,
            _uri=storage.uri(),
            _fs=storage.fs,
        )

    @classmethod
    def from_path(
        cls, path: str | os.PathLike, storage_filesystem: Any = None, storage_options: dict | None = None
    ) -> Result:
        """Read a finished, failed or still running run back from its folder.

        Only committed checkpoints are listed; a folder left half-written by a
        crash is ignored. A run recorded as running whose driver is gone (its
        lease is stale) has ``error`` set, saying so: run it again to resume it.
        ``error`` is a :class:`TrainingFailedError` (what ``except TrainingFailedError``
        around ``fit()`` catches) holding the recorded error's text.
        """
        from trainlib._internal.storage.lease import read_lease

        storage = RunStorage.open_existing(path, storage_filesystem, storage_options, caller="Result.from_path")
        record = RunRecord.load(storage)
        error = None
        if record.status is RunStatus.FAILED:
            error = TrainingFailedError(record.error or "the run failed")  # the text; the class is fit()'s base
        elif record.status in (RunStatus.PENDING, RunStatus.RUNNING):
            lease = read_lease(storage)
            gone = lease.stale_reason() if lease is not None else None
            if gone:
                error = TrainingFailedError(
                    f"The run is recorded {record.status.value} but its driver ({lease.describe()}) is gone: {gone}. "
                    "It ended without recording how (killed, or its storage failed). Its committed checkpoints are "
                    "intact: run fit() again with the same RunConfig(name, storage_path) to resume it."
                )
        return cls.from_storage(
            storage, CheckpointConfig(**record.checkpoint_config), error, filesystem=storage_filesystem
        )


def _dataframe_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics-log row as a DataFrame row: what the user reported, then trainlib's bookkeeping where it does not
    collide (a user's own "step" or "timestamp" column must not be overwritten)."""
    bookkeeping = {
        "step": row["step"],
        "attempt": row["attempt"],
        "timestamp": row["time"],
        "checkpoint": row.get("checkpoint"),
    }
    return {**row["metrics"], **{k: v for k, v in bookkeeping.items() if k not in row["metrics"]}}
