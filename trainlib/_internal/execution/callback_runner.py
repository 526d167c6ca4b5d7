"""Runs the driver-side callbacks off the commit path: one background thread per callback. Driver only.

A tracking or orchestration call (MLflow, a Prefect artifact) can hang for as long as its
server accepts and does not answer. The controller commits a checkpoint as soon as every rank
reported it; the callbacks' hooks are queued here and run in order, each callback on its own
thread, so a stuck one delays neither the commits nor the other callbacks. At the end of the
run :meth:`CallbackRunner.drain` waits a bounded time and names what was not delivered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from trainlib.callbacks import Callback

logger = logging.getLogger("trainlib")


class _Lane:
    """One callback's queue and thread."""

    def __init__(self, callback: Callback):
        self.callback = callback
        self.queue: queue.Queue = queue.Queue()
        self.current: tuple[str, float] | None = None  # the hook running now, since when
        self.thread = threading.Thread(target=self._loop, name=f"trainlib-callback-{type(callback).__name__}",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            hook, args = self.queue.get()
            self.current = (hook, time.monotonic())
            try:
                getattr(self.callback, hook)(*args)
            except Exception as exc:  # noqa: BLE001 - a callback never fails training
                logger.warning("Callback %s.%s failed: %s: %s", type(self.callback).__name__, hook,
                               type(exc).__name__, exc)
            finally:
                self.current = None
                self.queue.task_done()


class CallbackRunner:
    """The hooks of ``callbacks``, called in order per callback, in the background."""

    def __init__(self, callbacks: list[Callback]):
        self._lanes = [_Lane(c) for c in callbacks]

    def notify(self, hook: str, *args: Any) -> None:
        """Queue ``hook(*args)`` for every callback; returns at once."""
        for lane in self._lanes:
            lane.queue.put((hook, args))

    def drain(self, timeout: float) -> list[Callback]:
        """Wait up to ``timeout`` s for every queued hook; return the callbacks that are done (the others are named)."""
        deadline = time.monotonic() + timeout
        for lane in self._lanes:
            while lane.queue.unfinished_tasks and time.monotonic() < deadline:
                time.sleep(0.05)
        done = []
        for lane in self._lanes:
            if not lane.queue.unfinished_tasks:
                done.append(lane.callback)
                continue
            hook, since = lane.current or ("?", time.monotonic())
            logger.warning(
                "Callback %s has not finished: %s has been running for %.0f s (is its server reachable?) and %d "
                "hook call(s) are not delivered. Training and its checkpoints are complete; the run ends "
                "without waiting for it.", type(lane.callback).__name__, hook, time.monotonic() - since,
                lane.queue.unfinished_tasks)
        return done
