"""``Result``: what ``fit()`` returns, and what ``Result.from_path`` reads back. Driver only."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from trainlib._internal.storage.retention import rank_checkpoints
from trainlib._internal.storage.run_record import RunRecord, RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig
from trainlib.errors import TrainlibError


@dataclasses.dataclass
class Result:
    """The outcome of a training run.

    Attributes:
        metrics: rank 0's last reported metrics.
        checkpoint: the latest committed checkpoint, or None.
        path: the run's folder (a URL for remote storage).
        error: the exception that ended the run, or None if it finished.
        metrics_dataframe: every report as a row (``step``, ``attempt``,
            ``timestamp``, ``checkpoint`` and the metrics), or None.
        best_checkpoints: the kept checkpoints as ``(Checkpoint, metrics)``,
            best first (by ``checkpoint_score_attribute``, else newest first).
        filesystem: the fsspec filesystem of ``path``.

    Example:
        >>> result = trainer.fit()
        >>> result.metrics["loss"], result.checkpoint
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    path: str
    error: BaseException | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = dataclasses.field(default_factory=list)
    filesystem: Any = dataclasses.field(default=None, repr=False)
    # The metrics log's rows; the DataFrame is built from them on first use, so fit() does
    # not import pandas (~0.5 s, ~70 MB) for a caller that never looks.
    _metrics_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        """Every report as a row of a pandas DataFrame, or None when nothing was reported."""
        if not self._metrics_rows:
            return None
        if "_dataframe" not in self.__dict__:
            import pandas as pd

            self.__dict__["_dataframe"] = pd.DataFrame(
                [{**r["metrics"], "step": r["step"], "attempt": r["attempt"], "timestamp": r["time"],
                  "checkpoint": r.get("checkpoint")} for r in self._metrics_rows]
            )
        return self.__dict__["_dataframe"]

    def __repr__(self) -> str:
        error = f", error={type(self.error).__name__}" if self.error else ""
        return f"Result(metrics={self.metrics}, checkpoint={self.checkpoint}, path={self.path!r}{error})"

    @classmethod
    def from_storage(cls, storage: RunStorage, checkpoint_config: CheckpointConfig,
                     error: BaseException | None = None) -> "Result":
        rows = storage.read_metrics_log()
        committed = storage.committed_checkpoints()
        latest = committed[-1] if committed else None
        best = rank_checkpoints(committed, checkpoint_config)
        return cls(
            metrics=rows[-1]["metrics"] if rows else None,
            checkpoint=Checkpoint(latest.path, storage.fs) if latest else None,
            path=storage.uri(),
            error=error,
            _metrics_rows=rows,
            best_checkpoints=[(Checkpoint(c.path, storage.fs), c.metrics) for c in best],
            filesystem=storage.fs,
        )

    @classmethod
    def from_path(cls, path: str | os.PathLike, storage_filesystem: Any = None,
                  storage_options: dict | None = None) -> "Result":
        """Read a finished, failed or still running run back from its folder.

        Only committed checkpoints are listed; a folder left half-written by a
        crash is ignored.
        """
        storage = RunStorage.open_existing(path, storage_filesystem, storage_options, caller="Result.from_path")
        record = RunRecord.load(storage)
        error = None
        if record.status is RunStatus.FAILED:
            error = TrainlibError(record.error or "the run failed")
        return cls.from_storage(storage, CheckpointConfig(**record.checkpoint_config), error)
