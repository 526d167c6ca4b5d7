"""Training progress within an epoch: what rank 0 publishes, and the board that keeps the latest.

Runs in two places: :class:`ProgressMeter` in rank 0's worker process (inside the training
loop), which publishes at most every ``interval_s`` to a :class:`ProgressBoard`: one slot of Ray's
key-value store (in the GCS), which whoever shows the progress reads (the flow process polls it).
Nothing of it goes through trainlib's report/commit path.

Example::

    board = ProgressBoard.create()                       # driver side; travels in train_loop_config
    meter = ProgressMeter(board, epochs=3, steps=len(loader), world_size=2)  # rank 0
    meter.start_epoch(0); meter.step(batch_size=128)
    board.latest()                                       # EpochProgress(...) or None
    board.remove()                                       # driver side, when the run is over
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from typing import Protocol

DEFAULT_INTERVAL_S = 2.0  # rank 0 publishes at most this often


@dataclasses.dataclass(frozen=True)
class EpochProgress:
    """Where rank 0 is within the run.

    Attributes:
        epoch: the epoch in progress, counted from 0.
        epochs: the run's epochs.
        step: batches rank 0 finished in this epoch.
        steps: batches per epoch on rank 0.
        images_per_s: training throughput of all workers (rank 0's rate times the world size).
        elapsed_s: seconds since this epoch started.
    """

    epoch: int
    epochs: int
    step: int
    steps: int
    images_per_s: float
    elapsed_s: float

    @property
    def eta_s(self) -> float | None:
        """Seconds until this epoch's last step at the current rate (None before the first step)."""
        if self.step <= 0:
            return None
        return (self.steps - self.step) * self.elapsed_s / self.step

    @property
    def run_fraction(self) -> float:
        """The part of the whole run done, in [0, 1]."""
        return min(1.0, (self.epoch + self.step / max(self.steps, 1)) / max(self.epochs, 1))

    def describe(self) -> str:
        """One line for a person: ``epoch 2/3, step 40/94 (43%), 812 images/s, epoch ETA 0:07``."""
        eta = "?" if self.eta_s is None else _clock(self.eta_s)
        return (
            f"epoch {self.epoch + 1}/{self.epochs}, step {self.step}/{self.steps} "
            f"({self.step / max(self.steps, 1):.0%}), {self.images_per_s:.0f} images/s, epoch ETA {eta}"
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressSink(Protocol):
    """Where :class:`ProgressMeter` sends its snapshots."""

    def publish(self, progress: EpochProgress) -> None: ...


BOARD_NAMESPACE = "trainlib-pipeline-progress"


@dataclasses.dataclass(frozen=True)
class ProgressBoard:
    """The latest :class:`EpochProgress` of one training run: a key in Ray's key-value store (the GCS).

    A key, not an actor: an actor takes a worker process of its own, and on the pipeline's local Ray
    the one it took was a worker Ray had prestarted with torch imported, which training's first
    worker then started on instead (docs/benchmarks.md, "The pipeline (kept)"). A publication is one small
    write to the GCS (well under a
    millisecond on a local Ray), which rank 0 waits for, where the actor call did not. Ray's ``internal_kv``
    is experimental: its use is kept to this class.

    Attributes:
        key: the run's key (random), in :data:`BOARD_NAMESPACE`.
    """

    key: str

    @classmethod
    def create(cls) -> ProgressBoard:
        """A new, empty board (Ray must be connected wherever it is used)."""
        return cls(key=uuid.uuid4().hex)

    def publish(self, progress: EpochProgress) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(self.key, json.dumps(dataclasses.asdict(progress)), namespace=BOARD_NAMESPACE)

    def latest(self) -> EpochProgress | None:
        """The last progress published, or None before the first."""
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(self.key, namespace=BOARD_NAMESPACE)
        return None if raw is None else EpochProgress(**json.loads(raw))

    def remove(self) -> None:
        """Delete the key (the run is over)."""
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(self.key, namespace=BOARD_NAMESPACE)


class ProgressMeter:
    """Counts rank 0's steps and publishes :class:`EpochProgress` at most every ``interval_s``.

    Args:
        sink: where to publish.
        epochs: the run's epochs.
        steps: batches per epoch on this rank.
        world_size: the number of workers (throughput is this rank's times it).
        interval_s: the shortest time between two publications (the epoch's last step is
            always published).
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        sink: ProgressSink,
        epochs: int,
        steps: int,
        world_size: int,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sink, self.epochs, self.steps, self.world_size = sink, epochs, steps, world_size
        self.interval_s, self.clock = interval_s, clock
        self._epoch, self._step, self._images = 0, 0, 0
        self._started = self._last = clock()

    def start_epoch(self, epoch: int) -> None:
        """Start counting ``epoch`` (from 0) and publish its step 0."""
        self._epoch, self._step, self._images = epoch, 0, 0
        self._started = self._last = self.clock()
        self._publish(self._started)

    def step(self, batch_size: int) -> None:
        """Count one finished batch of ``batch_size`` images; publish if ``interval_s`` has passed."""
        self._step += 1
        self._images += batch_size
        now = self.clock()
        if now - self._last >= self.interval_s or self._step == self.steps:
            self._publish(now)

    def _publish(self, now: float) -> None:
        self._last = now
        elapsed = max(now - self._started, 1e-9)
        try:
            self.sink.publish(
                EpochProgress(
                    epoch=self._epoch,
                    epochs=self.epochs,
                    step=self._step,
                    steps=self.steps,
                    images_per_s=self._images * self.world_size / elapsed if self._step else 0.0,
                    elapsed_s=elapsed,
                )
            )
        except Exception:  # noqa: BLE001 - showing progress never stops training
            pass
