"""Runs the driver-side callbacks off the commit path, on one background thread, in order. Driver only.

A tracking or orchestration call (MLflow, a Prefect log or artifact) can hang for as long as
its server accepts and does not answer. The controller commits a checkpoint as soon as every
rank reported it and queues the hooks here; one thread calls them in the order they were
queued, each event's callbacks in ``RunConfig.callbacks`` order, as Ray Train does. So the
callbacks see what they always saw, only later, and a slow one delays no commit. At the end
of the run :meth:`CallbackRunner.drain` waits a bounded time and names what was not delivered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from trainlib.callbacks import Callback

logger = logging.getLogger("trainlib")


class CallbackRunner:
    """The hooks of ``callbacks``, called in order in the background."""

    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)
        self._queue: queue.Queue = queue.Queue()
        self._current: tuple[Callback, str, float] | None = None  # the hook running now, since when
        self._thread: threading.Thread | None = None

    def notify(self, hook: str, *args: Any) -> None:
        """Queue ``hook(*args)`` for every callback; returns at once."""
        if not self.callbacks:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainlib-callbacks", daemon=True)
            self._thread.start()
        self._queue.put((hook, args))

    def _loop(self) -> None:
        while True:
            hook, args = self._queue.get()
            try:
                for callback in self.callbacks:
                    self._current = (callback, hook, time.monotonic())
                    try:
                        getattr(callback, hook)(*args)
                    except Exception as exc:  # noqa: BLE001 - a callback never fails training
                        logger.warning(
                            "Callback %s.%s failed: %s: %s", type(callback).__name__, hook, type(exc).__name__, exc
                        )
            finally:
                self._current = None
                self._queue.task_done()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every queued hook; False (with a warning naming the stuck one) if not."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self._queue.unfinished_tasks:
            return True
        callback, hook, since = self._current or (None, "?", time.monotonic())
        logger.warning(
            "Callback %s.%s has not finished after %.0f s (is its server reachable?); %d event(s) are not delivered "
            "to the callbacks, and after_run is not called. Training and its checkpoints are complete; the run "
            "ends without waiting for them.",
            type(callback).__name__,
            hook,
            time.monotonic() - since,
            self._queue.unfinished_tasks,
        )
        return False
