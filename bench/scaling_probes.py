"""What the scaling benchmark measures on its driver (bench_scaling.py): CPU at each report, peak RSS, the load.

Runs in the driver process: ``DriverProbe`` is a trainlib callback (driver-side), ``PeakRss`` a sampling thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import trainlib


class DriverProbe(trainlib.Callback):
    """Records, at each committed report, the time and this process's CPU time."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.commits: list[tuple[int, float, float, dict]] = []  # step, wall, cpu, metrics

    def after_report(self, run, report):
        cpu = self.process.cpu_times()
        self.commits.append((report.step, time.time(), cpu.user + cpu.system, dict(report.metrics)))


class PeakRss:
    """Samples this process's resident memory every 50 ms in a thread."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def machine_load() -> dict[str, Any]:
    import psutil

    return {
        "loadavg_1_5_15": [round(v, 2) for v in os.getloadavg()],
        "cpus": os.cpu_count(),
        "memory_available_gb": round(psutil.virtual_memory().available / 2**30, 1),
    }
