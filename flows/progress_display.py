"""Showing rank 0's progress within the epoch while the train task runs. Runs in the flow-run process.

A background thread polls the run's :class:`tasks.domain.progress.ProgressBoard` (a key in
Ray's key-value store), writes a line to the flow run's log (so to the terminal of ``python -m flows.main``
and to the Prefect UI) every ``log_every_s``, and moves a Prefect progress artifact every
``artifact_every_s``. None of its calls is on trainlib's path: training never waits for this
thread, and a slow or failing Prefect server only delays the display. Reading the board is a
read from Ray's GCS, which waits as long as Ray's own calls do (the actor call it replaced was
bounded at 5 s); leaving the display waits at most ``STOP_TIMEOUT_S`` for the thread.

Example::

    with ProgressDisplay(board, logger, key="training-progress-my-model", epochs=3):
        train_model.submit(...).result()
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from tasks.domain.progress import EpochProgress

POLL_S = 1.0  # how often the board is read
LOG_EVERY_S = 10.0  # a progress line at most this often
ARTIFACT_EVERY_S = 3.0  # the progress artifact moves at most this often
STOP_TIMEOUT_S = 10.0  # how long leaving the display waits for the thread


class ProgressDisplay:
    """Polls a progress board in a thread; logs and moves a progress artifact (see the module docstring).

    Args:
        board: the run's :class:`ProgressBoard`.
        logger: the flow run's logger.
        key: the progress artifact's key.
        description: the progress artifact's description.
    """

    def __init__(
        self,
        board: Any,
        logger: Any,
        key: str,
        description: str,
        log_every_s: float = LOG_EVERY_S,
        artifact_every_s: float = ARTIFACT_EVERY_S,
    ):
        self.board, self.logger, self.key, self.description = board, logger, key, description
        self.log_every_s, self.artifact_every_s = log_every_s, artifact_every_s
        self.latest: EpochProgress | None = None
        self.artifact_updates = 0
        self._artifact_id: Any = None
        self._shown_log: EpochProgress | None = None
        self._shown_artifact: EpochProgress | None = None
        self._last_log = self._last_artifact = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProgressDisplay:
        context = contextvars.copy_context()  # Prefect's settings and run context, for the thread's API calls
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name="trainlib-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)

    def _loop(self) -> None:
        from prefect.artifacts import create_progress_artifact

        try:
            self._artifact_id = create_progress_artifact(0.0, key=self.key, description=self.description)
        except Exception as exc:  # noqa: BLE001 - the display is optional, training is not
            self.logger.warning("No progress artifact: %s", exc)
        while not self._stop.wait(POLL_S):
            self._tick(final=False)
        self._tick(final=True)  # the last state reached (the end of the run, when it finished)

    def _tick(self, final: bool) -> None:
        from prefect.artifacts import update_progress_artifact

        try:
            progress = self.board.latest()
        except Exception:  # noqa: BLE001 - a board that cannot be read now: try again next round
            return
        if progress is None:
            return
        self.latest = progress
        now = time.monotonic()
        if progress != self._shown_log and (final or now - self._last_log >= self.log_every_s):
            self.logger.info("Training: %s", progress.describe())
            self._shown_log, self._last_log = progress, now
        if (
            self._artifact_id is not None
            and progress != self._shown_artifact
            and (final or now - self._last_artifact >= self.artifact_every_s)
        ):
            try:
                update_progress_artifact(
                    self._artifact_id,
                    progress=round(100 * progress.run_fraction, 1),
                    description=f"{self.description}: {progress.describe()}",
                )
                self.artifact_updates += 1
            except Exception as exc:  # noqa: BLE001
                self.logger.debug("Progress artifact not updated: %s", exc)
            self._shown_artifact, self._last_artifact = progress, now
