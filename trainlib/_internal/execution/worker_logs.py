"""The workers' output of the embedded Ray, read by a thread of the driver instead of Ray's log monitor. Driver only.

Ray's log monitor is a process of its own (~80 MB, a Python interpreter with Ray imported,
polling every 0.1 s) that tails every worker's log files and publishes the new lines through the
GCS to the drivers, whose printer thread prints them as ``(TrainWorker pid=...) line``. In the
embedded single-node Ray that trainlib starts, this process is the only driver, so the same reader
(Ray's ``LogMonitor`` class: actor and task names, rotation, dead workers' files) runs here, in a
thread, and hands its batches straight to Ray's printer: the same prefixes and deduplication, one
process fewer, and the last lines are read and printed before Ray shuts down, not after a sleep.

Ray's classes are private: with a Ray that lacks them, :func:`without_log_monitor` leaves Ray's
log monitor alone and :func:`start_log_tail` returns None.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from trainlib._internal.util.patching import replaced_attribute

logger = logging.getLogger("trainlib")

POLL_S = 0.1  # as Ray's log monitor: how long to wait after a pass that found no new line

_skipped = False  # the last Ray node started in this process has no log monitor


@contextlib.contextmanager
def without_log_monitor() -> Iterator[None]:
    """Inside the block, a local Ray node starts without its log monitor process (:func:`start_log_tail` replaces it).

    Ray's ``Node.start_log_monitor`` (private) is replaced for the block; with a Ray that lacks it or
    the log reader, Ray starts its log monitor as usual. Not thread-safe against another thread
    starting a Ray node in the same process (nothing in trainlib does).
    """
    global _skipped
    _skipped = False
    try:
        from ray._private.log_monitor import LogMonitor  # noqa: F401 - the reader start_log_tail needs
        from ray._private.node import Node
    except ImportError:
        yield
        return
    with replaced_attribute(Node, "start_log_monitor", lambda original: _skip_log_monitor):
        yield


def _skip_log_monitor(self: Any) -> None:
    global _skipped
    _skipped = True


class _DriverPrinter:
    """What Ray's ``LogMonitor`` publishes to: Ray's own printer of worker output, called here.

    Called directly rather than through the driver's dispatcher, whose printer Ray removes at
    ``ray.shutdown()``: lines a worker wrote just before the user shuts Ray down are still printed.
    """

    def __init__(self, job_id_hex: str, localhost: str, ignore_prefix: bool):
        from ray._private.worker import print_to_stdstream

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
        self._lock = threading.Lock()  # one pass at a time: the thread's, or stop()'s last one
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainlib-worker-logs", daemon=True)

    def start(self) -> "LogTail":
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
                logger.log(logging.DEBUG if warned else logging.WARNING,
                           "Reading the workers' log files failed; their output may be incomplete here "
                           "(it stays in Ray's session log folder)", exc_info=True)
                warned = True
                printed = False
            if not printed:
                self._stopped.wait(POLL_S)

    def stop(self) -> None:
        """Stop the thread, then print what the workers wrote since its last pass."""
        self._stopped.set()
        self._thread.join(timeout=5)
        try:
            while self._pass():  # a pass reads at most LOG_MONITOR_NUM_LINES_TO_READ lines a file
                pass
        except Exception:  # noqa: BLE001 - exiting; the lines stay in Ray's session log folder
            logger.debug("Last read of the workers' log files failed", exc_info=True)
        with self._lock:
            self._monitor._close_all_files()


def start_log_tail() -> LogTail | None:
    """With a local Ray node started under :func:`without_log_monitor` connected: start its reader here, else None."""
    if not _skipped:
        return None
    import ray
    from ray._private import services
    from ray._private import worker as ray_worker
    from ray._private.log_monitor import LogMonitor, is_proc_alive

    # Its INFO lines ("Beginning to track file ...") went to the daemon's own log file; here they would
    # reach the user's console.
    logging.getLogger(LogMonitor.__module__).setLevel(logging.WARNING)
    node = ray_worker._global_node
    # As Ray's own printer: no "(name pid=...)" prefix when the job's logging config or the user asks so.
    ignore_prefix = getattr(ray_worker, "_should_ignore_worker_log_prefix", lambda worker: False)(ray_worker.global_worker)
    printer = _DriverPrinter(ray.get_runtime_context().get_job_id(), services.get_node_ip_address(), ignore_prefix)
    monitor = LogMonitor(node.node_ip_address, node.get_logs_dir_path(), printer, is_proc_alive)
    return LogTail(monitor).start()
