"""Driver-side callbacks: typed hooks around one training run. Runs on the driver only.

A callback sees the run from the driver, so there is one of it per run
whatever the world size. ``before_run`` may raise to stop the run before any
worker runs the training function (e.g. tracking server unreachable; with
Ray already up, the workers' processes start meanwhile and are stopped); errors in the other hooks
are logged and never fail training. A callback that must remember something
across restarts and resumes of the run (an MLflow run id) returns it from
``state_dict``; the trainer saves it in the run record and hands it back through
``load_state_dict`` when the run is continued.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib._internal.storage.run_record import RunRecord
    from trainlib.checkpoint import Checkpoint
    from trainlib.errors import WorkerError
    from trainlib.result import Result


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a callback knows about the run.

    ``record`` is the run's persisted record (``trainlib_run.json``): its status,
    configs and, once it ended, its error. Callbacks read it; the trainer writes it.
    """

    name: str
    path: str  # the run folder's URL
    world_size: int
    use_gpu: bool
    train_loop_config: dict[str, Any] | None
    scaling_config: dict[str, Any]
    resumed_from: str | None  # the checkpoint the run started from, if any
    record: RunRecord
    # The reports an earlier fit() of this run committed, oldest first (their checkpoints are not
    # attached: ``checkpoint`` is None). A tracker that a crash may have cut off compares them with
    # what it holds.
    earlier_reports: tuple[ReportRecord, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReportRecord:
    """One committed report: rank 0's metrics, and the checkpoint if one was reported."""

    step: int
    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    attempt: int
    reported_at: float


class Callback:
    """Base class for driver-side callbacks; override the hooks you need."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in the run record (default: the class name)."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state to keep in the run record (saved after ``before_run`` and at the end)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state saved by an earlier ``fit()`` of the same run; called before ``before_run``."""

    def before_run(self, run: RunInfo) -> None:
        """Before any worker runs the training function. Raising here stops the run (and the workers' processes,
        which start meanwhile when Ray is already up)."""

    def after_report(self, run: RunInfo, report: ReportRecord) -> None:
        """After a report of all ranks was committed (checkpoint durable)."""

    def after_checkpoint_deleted(self, run: RunInfo, checkpoint: Checkpoint) -> None:
        """After retention deleted a checkpoint."""

    def after_failure(self, run: RunInfo, failure: WorkerError, will_restart: bool) -> None:
        """After a worker failure, before the group restarts or the run fails."""

    def after_run(self, run: RunInfo, result: Result) -> None:
        """After the run ended; ``result.error`` is set when it failed."""
