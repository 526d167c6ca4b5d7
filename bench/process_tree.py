"""The process tree of a benchmark's job: its summed RSS, CPU seconds by kind of process, what outlived it.

Runs in the benchmark's own process (a sampling thread), watching the job it started: every descendant, kept track
of even if re-parented. Used by the overhead benchmark (bench_overhead.py) and the Ray Data benchmark.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil

# Processes that run the training steps; every other process of a job's tree is overhead.
TRAINING_PROCESSES = ("ray::TrainWorker", "ray::RayTrainWorker", "torchrun_job.py", "plain_job.py", "local_job.py")


class TreeSampler(threading.Thread):
    """Samples the summed RSS of a process and all its descendants until stopped."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True, name="rss-sampler")
        self.root = psutil.Process(pid)
        self.interval = interval
        self.known: dict[int, psutil.Process] = {pid: self.root}
        self.names: dict[int, str] = {}
        self.labels: dict[int, str] = {}
        self.cpu_s: dict[int, float] = {}
        self.history: list[tuple[float, dict[int, float]]] = []
        self.peak_bytes = 0
        self.peak_processes = 0
        self.peak_by_process: dict[str, int] = {}  # label (pid) -> RSS at the tree's peak: where the memory is
        self.samples = 0
        self._halt = threading.Event()

    def _discover(self) -> None:
        # Children of every process seen so far: a Ray worker whose parent exited is still found.
        for proc in list(self.known.values()):
            try:
                for child in proc.children(recursive=True):
                    if child.pid not in self.known:
                        self.known[child.pid] = child
                        try:
                            self.names[child.pid] = " ".join(child.cmdline()[:3])[:120] or child.name()
                        except psutil.Error:
                            self.names[child.pid] = "?"
            except psutil.Error:
                pass

    def sample(self) -> None:
        self._discover()
        total, alive, by_process = 0, 0, {}
        for pid, proc in list(self.known.items()):
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    total += rss
                    by_process[pid] = rss
                    times = proc.cpu_times()
                    self.cpu_s[pid] = times.user + times.system
                alive += 1
                if self.samples % 10 == 0 or pid not in self.labels:
                    label = process_label(proc)  # Ray renames its workers as they work
                    if label is not None:
                        self.labels[pid] = label
            except psutil.Error:
                pass
        self.history.append((time.time(), dict(self.cpu_s)))
        self.samples += 1
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_processes = total, alive
            self.peak_by_process = {f"{self.labels.get(pid, '?')} ({pid})": rss for pid, rss in by_process.items()}

    def cpu_by_label(self) -> dict[str, float]:
        """CPU seconds (user + system) each kind of process used, as last sampled."""
        out: dict[str, float] = {}
        for pid, seconds in self.cpu_s.items():
            label = self.labels.get(pid, "?")
            out[label] = round(out.get(label, 0.0) + seconds, 2)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def cpu_split(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds used between two times by the training processes and by all the others."""
        inside = [h for h in self.history if start <= h[0] <= end]
        if len(inside) < 2:
            return 0.0, 0.0
        (_, first), (_, last) = inside[0], inside[-1]
        training = other = 0.0
        for pid, seconds in last.items():
            used = seconds - first.get(pid, 0.0)
            if self.labels.get(pid, "?") in TRAINING_PROCESSES:
                training += used
            else:
                other += used
        return training, other

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def leftovers(self, grace_s: float) -> list[psutil.Process]:
        """Descendants still alive ``grace_s`` seconds after the job's process exited."""
        deadline = time.time() + grace_s
        while True:
            self._discover()
            alive = [p for pid, p in self.known.items() if pid != self.root.pid and _alive(p)]
            if not alive or time.time() >= deadline:
                return alive
            time.sleep(0.2)

    def end_leftovers(self, grace_s: float) -> list[psutil.Process]:
        """End the descendants still alive ``grace_s`` seconds after the job exited, one by one; return them."""
        leftovers = self.leftovers(grace_s)
        for p in leftovers:  # our own descendants that outlived the job
            try:
                p.kill()
            except psutil.Error:
                pass
        return leftovers


def wait_sampled(proc: subprocess.Popen, interval: float, timeout: float) -> tuple[int, float, TreeSampler]:
    """Wait for ``proc`` (killed after ``timeout`` s) while sampling its tree: its exit code, exit time, the sampler."""
    sampler = TreeSampler(proc.pid, interval)
    sampler.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    t_exit = time.time()
    sampler.stop()
    return rc, t_exit, sampler


def process_label(proc: psutil.Process) -> str | None:
    """A short name for a process: Ray's title (ray::TrainWorker), else the program or Python script.

    None when the command line cannot be read (an exiting process has none): keep the last label.
    """
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return None
    if not cmd:
        return None
    if cmd[0].startswith("ray::"):
        return cmd[0].split(".")[0].split(" ")[0]
    exe = os.path.basename(cmd[0])
    if exe.startswith("python"):
        for i, arg in enumerate(cmd[1:], 1):
            if arg == "-m" and i + 1 < len(cmd):
                return cmd[i + 1]
            if arg.endswith(".py"):
                return os.path.basename(arg)
    return exe


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
