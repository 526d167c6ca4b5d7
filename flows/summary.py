"""What a pipeline run returns: its summary and the time of each step. Runs in the flow-run process.

:class:`PipelineSummary` is the training flow's return value (Prefect stores it, benchmarks read it);
:class:`Stopwatch` times each step into a :class:`StageTime`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tasks.domain.gates import GateResult, SliceScore


@dataclasses.dataclass(frozen=True)
class StageTime:
    """How long one step took: ``seconds`` (monotonic) and its wall-clock window (``time.time()``)."""

    seconds: float
    started_at: float
    ended_at: float


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """The time of each of the pipeline's four steps."""

    download: StageTime
    train: StageTime
    evaluate: StageTime
    register: StageTime

    def seconds(self) -> dict[str, float]:
        """Step name -> seconds, for printing and benchmark records."""
        return {field.name: getattr(self, field.name).seconds for field in dataclasses.fields(self)}


class Stopwatch:
    """Times the block it guards; ``time`` is its :class:`StageTime` once the block ends."""

    time: StageTime

    def __enter__(self) -> Stopwatch:
        self._started, self._wall = time.perf_counter(), time.time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.time = StageTime(time.perf_counter() - self._started, self._wall, time.time())


@dataclasses.dataclass(frozen=True)
class PipelineSummary:
    """What one pipeline run produced, as the flow returns it.

    Attributes:
        run_path, checkpoint, mlflow_run_id: the training run's folder, the evaluated checkpoint, its MLflow run.
        model_name, model_version, champion_version: the registered version and the champion after this run.
        promoted, decision: whether the new version became champion, and why (a sentence).
        gates: each promotion gate's outcome (the margin first), as tagged on the version.
        newest_slice: the new version's accuracy on the newest batch's test images (None: no batches).
        test_accuracy, test_loss: the evaluation on the test split.
        champion_test_accuracy: the previous champion's accuracy on the same images (None: there was none).
        recipe: the training recipe's name.
        downloaded_files: data-set files fetched from a mirror by this run (empty: all from the cache).
        training_metrics: the last report's metrics.
        fit_seconds: trainlib's ``fit()`` wall time (0 when a finished training was read back).
        stage_times: seconds and wall-clock window of each step (download, train, evaluate, register); the
            windows are for benchmarks that sample other processes. ``download`` is the snapshot and validation
            steps for a user's data.
        data_digest: the data version (the snapshot's digest) of a user's data; None for a built-in set.
    """

    run_path: str
    checkpoint: str
    mlflow_run_id: str | None
    model_name: str
    model_version: str
    champion_version: str
    promoted: bool
    decision: str
    test_accuracy: float
    test_loss: float
    champion_test_accuracy: float | None
    recipe: str
    downloaded_files: list[str]
    training_metrics: dict[str, Any]
    fit_seconds: float
    stage_times: StageTimes
    data_digest: str | None = None
    gates: tuple[GateResult, ...] = ()
    newest_slice: SliceScore | None = None
