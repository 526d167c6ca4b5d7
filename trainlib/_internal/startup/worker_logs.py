"""The workers' output of the embedded Ray, read by a thread of the driver instead of Ray's log monitor. Driver only.

Ray's log monitor is a process of its own (~80 MB, a Python interpreter with Ray imported,
polling every 0.1 s) that tails every worker's log files and publishes the new lines through the
GCS to the drivers, whose printer thread prints them as ``(TrainWorker pid=...) line``. In the
embedded single-node Ray that trainlib starts, this process is the only driver, so the same reader
(Ray's ``LogMonitor`` class: actor and task names, rotation, dead workers' files) runs here, in a
thread, and hands its batches straight to Ray's printer: the same prefixes and deduplication, one
process fewer, and the last lines are read and printed before Ray shuts down, not after a sleep.

Ray's classes are private: with a Ray that lacks them, :func:`without_log_monitor` leaves Ray's
log monitor alone; if the reader cannot start, Ray's log monitor is started after all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.startup.adapter import install_attribute, replaced_attribute

logger = logging.getLogger("trainlib")

POLL_S = 0.1  # as Ray's log monitor: how long to wait after a pass that found no new line


@dataclasses.dataclass
class SkippedLogMonitor:
    """Set by :func:`without_log_monitor`: whether the node started in its block has no log monitor."""

    skipped: bool = False


@contextlib.contextmanager
def without_log_monitor() -> Iterator[SkippedLogMonitor]:
    """Inside the block, a local Ray node starts without its log monitor process (:func:`start_log_tail` replaces it).

    Ray's ``Node.start_log_monitor`` (private) is replaced for the block; with a Ray that lacks it or
    the log reader, Ray starts its log monitor as usual. Not thread-safe against another thread
    starting a Ray node in the same process (nothing in trainlib does).
    """
    outcome = SkippedLogMonitor()
    try:
        from ray._private.log_monitor import LogMonitor  # noqa: F401 - the reader start_log_tail needs
        from ray._private.node import Node
    except ImportError:
        yield outcome
        return

    def skip(self: Any) -> None:
        outcome.skipped = True

    with replaced_attribute(Node, "start_log_monitor", lambda original: skip):
        yield outcome


class _WholeLines:
    """A text stream that hands each line to ``stream`` in one ``write`` (see :func:`print_whole_lines`)."""

    def __init__(self, stream: Any):
        self._stream = stream
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        if text.endswith("\n"):
            self.write_pending()
        return len(text)

    def write_pending(self) -> None:
        if self._pending:
            self._stream.write("".join(self._pending))
            self._pending.clear()

    def flush(self) -> None:
        self.write_pending()
        self._stream.flush()


def print_whole_lines() -> None:
    """From now on, Ray's printer of the workers' output hands each line to the console in one write.

    Ray's ``print_worker_logs`` (private) writes a line with ``print()``: the text, then ``"\n"``, two
    writes, between which another thread of the driver (Prefect's or the user's logging) could write
    and glue its line to a worker's. Process-wide and idempotent: every driver of trainlib or the
    pipeline calls it before Ray starts printing. With a Ray that lacks the function, nothing changes.
    """
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    if getattr(getattr(ray_worker, "print_worker_logs", None), "_whole_lines", False):
        return

    def whole_lines(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def print_worker_logs(data: dict[str, Any], print_file: Any, ignore_prefix: bool = False) -> None:
            sink = _WholeLines(print_file)
            original(data, sink, ignore_prefix)
            sink.write_pending()

        print_worker_logs._whole_lines = True  # type: ignore[attr-defined]
        return print_worker_logs

    install_attribute(ray_worker, "print_worker_logs", whole_lines)


class _DriverPrinter:
    """What Ray's ``LogMonitor`` publishes to: Ray's own printer of worker output, called here.

    Called directly rather than through the driver's dispatcher, whose printer Ray removes at
    ``ray.shutdown()``: lines a worker wrote just before the user shuts Ray down are still printed.
    """

    def __init__(self, job_id_hex: str, localhost: str, ignore_prefix: bool):
        from ray._private.worker import print_to_stdstream

        print_whole_lines()
        self._print = print_to_stdstream
        self._job_id_hex = job_id_hex
        self._localhost = localhost
        self._ignore_prefix = ignore_prefix

    def publish_logs(self, data: dict[str, Any]) -> None:
        if data.get("job") and data["job"] != self._job_id_hex:
            return  # another driver's workers (none in an embedded Ray): Ray's subscriber skips them too
        data["localhost"] = self._localhost
        self._print(data, ignore_prefix=self._ignore_prefix)


class LogTail:
    """A driver thread that prints the workers' new log lines; :meth:`stop` prints the last ones."""

    def __init__(self, monitor: Any):
        self._monitor = monitor
        self._lock = threading.Lock()  # one pass at a time: the thread's, or stop()'s last ones
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainlib-worker-logs", daemon=True)

    def start(self) -> LogTail:
        self._thread.start()
        return self

    def _pass(self) -> bool:
        """Read every worker log file's new lines and print them; whether there were any."""
        with self._lock:
            # Ray's log monitor looks for new files on every pass while a node has few (< 1,000).
            self._monitor.update_log_filenames()
            self._monitor.open_closed_files()
            return self._monitor.check_log_files_and_publish_updates()

    def _run(self) -> None:
        warned = False
        while not self._stopped.is_set():
            try:
                printed = self._pass()
            except Exception:  # noqa: BLE001 - as Ray's monitor, a failed pass is logged, not fatal to the run
                # Once: a lasting failure would otherwise repeat it ten times a second.
                logger.log(
                    logging.DEBUG if warned else logging.WARNING,
                    "Reading the workers' log files failed; their output may be incomplete here "
                    "(it stays in Ray's session log folder)",
                    exc_info=True,
                )
                warned = True
                printed = False
            if not printed:
                self._stopped.wait(POLL_S)

    def stop(self) -> None:
        """Stop the thread, then print what the workers wrote since its last pass (for at most
        ``WORKER_LOG_FLUSH_S``: workers that keep printing must not hold the driver's exit)."""
        self._stopped.set()
        self._thread.join(timeout=5)
        deadline = time.monotonic() + tunables.WORKER_LOG_FLUSH_S
        try:
            while self._pass() and time.monotonic() < deadline:
                pass  # a pass reads at most LOG_MONITOR_NUM_LINES_TO_READ lines a file
            with self._lock:
                self._monitor._close_all_files()
        except Exception:  # noqa: BLE001 - exiting; the lines stay in Ray's session log folder
            logger.debug("Last read of the workers' log files failed", exc_info=True)


def start_log_tail(skipped: SkippedLogMonitor) -> LogTail | None:
    """With the node that :func:`without_log_monitor` started without its log monitor connected: read the
    workers' output here. None when it has Ray's log monitor, or nothing prints worker output
    (``log_to_driver=False``). If the reader cannot start (another Ray version), Ray's log monitor is
    started after all."""
    if not skipped.skipped:
        return None
    from ray._private import worker as ray_worker

    printing = getattr(ray_worker.global_worker, "logger_thread", None)
    if printing is None or not printing.is_alive():  # log_to_driver=False: Ray prints nothing either
        return None
    try:
        return LogTail(_monitor(ray_worker)).start()
    except Exception:  # noqa: BLE001 - fall back to Ray's own process
        logger.debug("The driver's reader of the workers' logs could not start; using Ray's log monitor", exc_info=True)
        ray_worker._global_node.start_log_monitor()
        return None


def _monitor(ray_worker: Any) -> Any:
    """Ray's ``LogMonitor`` over this node's log folder, printing through :class:`_DriverPrinter`."""
    import ray
    from ray._private import services
    from ray._private.log_monitor import LogMonitor, is_proc_alive

    # Its INFO lines ("Beginning to track file ...") went to the daemon's own log file; here they would
    # reach the user's console.
    logging.getLogger(LogMonitor.__module__).setLevel(logging.WARNING)
    node = ray_worker._global_node
    # As Ray's own printer: no "(name pid=...)" prefix when the job's logging config (or, in newer Rays,
    # the user) asks so.
    ignore_prefix = getattr(
        ray_worker,
        "_should_ignore_worker_log_prefix",
        lambda worker: getattr(worker, "job_logging_config", None) is not None,
    )(ray_worker.global_worker)
    printer = _DriverPrinter(ray.get_runtime_context().get_job_id(), services.get_node_ip_address(), ignore_prefix)
    return LogMonitor(node.node_ip_address, node.get_logs_dir_path(), printer, is_proc_alive)
