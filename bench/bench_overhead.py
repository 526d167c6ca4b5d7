"""Overhead benchmark: the tutorial's job on trainlib, Ray Train, torchrun and plain PyTorch.

    make bench                                    # = python bench/bench_overhead.py
    python bench/bench_overhead.py --steps 5 --repeats 1 --results-dir /tmp/bench   # a quick try

Runs on the machine that calls it (the driver of nothing: every job is a fresh
subprocess). Each variant trains the tutorial's ResNet18 on the real FashionMNIST
for ``--steps`` optimizer steps per worker, with 2 workers (plain PyTorch and the
local modes, ``--variants trainlib_local,raytrain_local`` with ``bench/jobs/local_job.py``: one
process, one torch thread), and saves rank 0's state_dict once at the end through the framework's own
mechanism. ``trainlib_launch`` runs trainlib's job script through ``python -m trainlib`` (Ray and its
workers' torch import started before the script's imports). Variants are interleaved, ``--repeats`` times
each, in a rotated order.

For every run, measured from this process:

* wall time: ``Popen`` to exit of the job's process;
* time to first step: ``Popen`` to the moment rank 0 holds its first batch
  (``time.time()`` written by the job; same clock, same machine);
* steady-state steps/s: 1 / median interval between rank 0's step ends, skipping
  the first ``--warmup-steps`` steps;
* peak memory: the largest sum of RSS over the job's whole process tree, sampled
  every ``--sample-interval`` seconds: for Ray variants the driver, GCS, raylet,
  dashboard/agents, the Ray Train controller and the worker processes (every
  descendant, kept track of even if re-parented). RSS counts shared pages (torch's
  libraries) once per process, so it overstates physical memory equally for all.

Writes ``<results-dir>/overhead.json`` (raw runs, medians, ratios, machine info,
load average before/after) and ``<results-dir>/overhead.md`` (the tables).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "bench", "jobs")
DATA = os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist")  # the offline mirror beside the repository
RESULTS = os.path.join(REPO, "bench", "results")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))  # results_files, also when this file is loaded by path (tests)

from results_files import check_name, write_results  # noqa: E402

VARIANTS = {
    "trainlib": "trainlib TorchTrainer",
    "trainlib_launch": "trainlib TorchTrainer, the same script run by `python -m trainlib` (Ray started first)",
    "raytrain": "Ray Train TorchTrainer",
    "torchrun": "torchrun + DDP by hand",
    "plain": "plain PyTorch, 1 process",
    "trainlib_local": "trainlib local mode (num_workers=0), 1 process",
    "raytrain_local": "Ray Train local mode (num_workers=0), 1 process",
    "trainlib_base": "trainlib from --baseline (the code before a change), same job",
}
# The targets' table; the local modes and trainlib_base on request.
DEFAULT_VARIANTS = ("trainlib", "trainlib_launch", "raytrain", "torchrun", "plain")
# Issue 14's targets, on the 40-step tutorial job with 2 workers.
TARGET_WALL_RATIO = 0.5  # trainlib wall / Ray Train wall, at most
TARGET_THROUGHPUT_RATIO = 1.0  # trainlib steady steps/s / torchrun's, at least
TARGET_FIRST_STEP_EXTRA_S = 3.0  # trainlib time to first step - torchrun's, at most
TARGET_RSS_RATIO = 1.2  # trainlib peak RSS of the process tree / torchrun's, at most


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per worker (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant; medians are reported (default 3)")
    parser.add_argument(
        "--warmup-steps", type=int, default=5, help="steps left out of the steady-state throughput (default 5)"
    )
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)}; "
        "trainlib_base comes with --baseline)",
    )
    parser.add_argument(
        "--data",
        default=DATA,
        help="folder with FashionMNIST's four .gz files (default ../shared/datasets/fashion-mnist)",
    )
    parser.add_argument(
        "--results-dir", default=RESULTS, help="where overhead.json and overhead.md go (default bench/results)"
    )
    parser.add_argument(
        "--name", default="overhead", help="result name: NAME.json and NAME.md (default overhead; overhead_400)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    parser.add_argument("--sample-interval", type=float, default=0.2, help="memory sampling period in seconds")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="a checkout of trainlib to compare with (e.g. `git archive <commit>` unpacked): adds "
        "the variant trainlib_base, the same job importing trainlib from DIR",
    )
    parser.add_argument(
        "--rebuild",
        metavar="JSON",
        help="run nothing: recompute the medians and tables from the raw runs of an overhead.json",
    )
    args = parser.parse_args(argv)
    try:
        check_name(args.name)
    except ValueError as e:
        parser.error(str(e))
    if args.rebuild:
        return args
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"--variants={args.variants!r}: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.baseline and "trainlib_base" not in variants:
        variants.append("trainlib_base")
    if "trainlib_base" in variants and not (args.baseline and os.path.isdir(os.path.join(args.baseline, "trainlib"))):
        parser.error(f"--baseline={args.baseline!r}: the trainlib_base variant needs a folder holding trainlib/")
    if args.steps <= args.warmup_steps + 1:
        parser.error(
            f"--steps={args.steps} must exceed --warmup-steps={args.warmup_steps} by 2 or more, "
            "so some steady-state intervals remain"
        )
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: use 1 or more")
    if not os.path.isdir(args.data):
        parser.error(f"--data={args.data!r} is not a folder: pass the folder holding train-images-idx3-ubyte.gz etc.")
    args.variants = variants
    return args


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


# Processes that run the training steps; every other process of a job's tree is overhead.
TRAINING_PROCESSES = ("ray::TrainWorker", "ray::RayTrainWorker", "torchrun_job.py", "plain_job.py", "local_job.py")


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


def command(variant: str, steps: int, data_root: str, storage: str, out: str) -> list[str]:
    job_args = ["--steps", str(steps), "--data-root", data_root, "--storage", storage, "--out", out]
    if variant == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            os.path.join(JOBS, "torchrun_job.py"),
            *job_args,
        ]
    if variant == "trainlib_launch":
        return [sys.executable, "-m", "trainlib", os.path.join(JOBS, "trainlib_job.py"), *job_args]
    if variant.endswith("_local"):
        return [sys.executable, os.path.join(JOBS, "local_job.py"), variant[: -len("_local")], *job_args]
    script = "trainlib" if variant == "trainlib_base" else variant
    return [sys.executable, os.path.join(JOBS, f"{script}_job.py"), *job_args]


def job_env(baseline: str | None = None) -> dict[str, str]:
    """The environment of every job: this one, without thread or Ray settings, so each framework picks its own.

    With ``baseline``, trainlib is imported from that folder instead of this checkout.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")
    }
    # The jobs import bench/jobs/common.py; Ray workers inherit this path from the driver's environment.
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and baseline is None]
    env["PYTHONPATH"] = os.pathsep.join([JOBS, os.path.abspath(baseline) if baseline else REPO] + inherited)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU only, for every variant
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_once(variant: str, args: argparse.Namespace, data_root: str, workdir: str, index: int) -> dict[str, Any]:
    run_dir = os.path.join(workdir, f"{index:03d}_{variant}")
    out, storage = os.path.join(run_dir, "out"), os.path.join(run_dir, "storage")
    os.makedirs(out)
    os.makedirs(storage)
    log_path = os.path.join(run_dir, "log.txt")
    load_before = os.getloadavg()
    with open(log_path, "wb") as log:
        t0 = time.time()
        env = job_env(args.baseline if variant == "trainlib_base" else None)
        # Ray puts the driver's working directory on its workers' import path: the baseline's
        # workers must start there, or they import this checkout's trainlib.
        cwd = os.path.abspath(args.baseline) if variant == "trainlib_base" else REPO
        proc = subprocess.Popen(
            command(variant, args.steps, data_root, storage, out),
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        sampler = TreeSampler(proc.pid, args.sample_interval)
        sampler.start()
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        t_exit = time.time()
        sampler.stop()
    leftovers = sampler.leftovers(grace_s=10.0)
    for p in leftovers:  # our own descendants that outlived the job: end them, one by one
        try:
            p.kill()
        except psutil.Error:
            pass
    record: dict[str, Any] = {
        "variant": variant,
        "index": index,
        "returncode": rc,
        "start": t0,
        "wall_s": t_exit - t0,
        "peak_rss_bytes": sampler.peak_bytes,
        "processes_at_peak": sampler.peak_processes,
        "rss_at_peak_by_process": dict(sorted(sampler.peak_by_process.items(), key=lambda kv: -kv[1])),
        "processes_seen": len(sampler.known),
        "memory_samples": sampler.samples,
        "leftover_processes": [sampler.names.get(p.pid, str(p.pid)) for p in leftovers],
        "cpu_s_by_process": sampler.cpu_by_label(),
        "load_average_at_start": load_before,
    }
    rank0_path, driver_path = os.path.join(out, "rank0.json"), os.path.join(out, "driver.json")
    if rc != 0 or not os.path.exists(rank0_path):
        with open(log_path, "rb") as f:
            record["error"] = f.read()[-4000:].decode(errors="replace")
        return record
    with open(rank0_path) as f:
        rank0 = json.load(f)
    driver = {}
    if os.path.exists(driver_path):
        with open(driver_path) as f:
            driver = json.load(f)
    ends = rank0["step_ends"]
    intervals = [b - a for a, b in zip(ends, ends[1:])][args.warmup_steps :]
    cpu = record["cpu_s_by_process"]
    steady_training_cpu, steady_other_cpu = sampler.cpu_split(ends[args.warmup_steps], ends[-1])
    script_start = driver.get("start", rank0.get("start"))
    record.update(
        {
            "framework": driver.get("framework", rank0.get("framework")),
            "time_to_first_step_s": rank0["first_step_start"] - t0,
            "first_step_s": ends[0] - rank0["first_step_start"],
            "steady_steps_per_s": 1.0 / statistics.median(intervals),
            # The job's fixed cost, independent of --steps: wall time outside the training steps.
            "outside_steps_s": (t_exit - t0) - (ends[-1] - rank0["first_step_start"]),
            # CPU seconds of the whole job, and during the steady-state steps: the training processes
            # versus everything else of the tree (launchers, drivers, Ray's daemons), on the same 2 cores.
            "cpu_s_training": round(sum(v for k, v in cpu.items() if k in TRAINING_PROCESSES), 2),
            "cpu_s_other": round(sum(v for k, v in cpu.items() if k not in TRAINING_PROCESSES), 2),
            "steady_cpu_share_other": (
                steady_other_cpu / (steady_training_cpu + steady_other_cpu)
                if steady_training_cpu + steady_other_cpu > 0
                else None
            ),
            "steady_intervals_s": intervals,
            "steps": len(ends),
            "world_size": rank0["world_size"],
            "final_loss": rank0["final_loss"],
            "checkpoint_bytes": driver.get("checkpoint_bytes", rank0.get("checkpoint_bytes")),
            "threads": {
                k: rank0.get(k)
                for k in ("torch_num_threads", "torch_num_interop_threads", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
            },
            # Where the time goes, in seconds from Popen.
            "phases_s": {
                "interpreter_start": script_start - t0,
                "imports_done": (driver.get("imported", rank0.get("imported")) - t0),
                "train_func_enter": rank0["train_func_enter"] - t0,
                "first_step_start": rank0["first_step_start"] - t0,
                "last_step_end": ends[-1] - t0,
                "report_s": rank0["report_end"] - rank0["report_start"],
                "after_last_step_to_exit": t_exit - ends[-1],
                **({"fit_end": driver["fit_end"] - t0} if "fit_end" in driver else {}),
            },
        }
    )
    return record


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    summary = {}
    for v in variants:
        ok = [r for r in runs if r["variant"] == v and r["returncode"] == 0 and "error" not in r]
        phases = {}
        if ok:
            for key in ok[0]["phases_s"]:
                phases[key] = statistics.median(r["phases_s"][key] for r in ok if key in r["phases_s"])
        summary[v] = {
            "label": VARIANTS[v],
            "framework": ok[0]["framework"] if ok else None,
            "runs_ok": len(ok),
            "runs_failed": sum(1 for r in runs if r["variant"] == v) - len(ok),
            "wall_s": median_of(ok, "wall_s"),
            "time_to_first_step_s": median_of(ok, "time_to_first_step_s"),
            "steady_steps_per_s": median_of(ok, "steady_steps_per_s"),
            "outside_steps_s": median_of(ok, "outside_steps_s"),
            "cpu_s_training": median_of(ok, "cpu_s_training"),
            "cpu_s_other": median_of(ok, "cpu_s_other"),
            "steady_cpu_share_other": median_of(ok, "steady_cpu_share_other"),
            "peak_rss_bytes": median_of(ok, "peak_rss_bytes"),
            "phases_s": phases,
            "world_size": ok[0]["world_size"] if ok else None,
            "threads": ok[0]["threads"] if ok else None,
        }
    return summary


def ratios(summary: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: str, b: str, key: str) -> float | None:
        if a in summary and b in summary and summary[a][key] and summary[b][key]:
            return summary[a][key] / summary[b][key]
        return None

    def target(value: float | None, text: str, met: Callable[[float], bool]) -> dict[str, Any]:
        return {"value": value, "target": text, "met": None if value is None else met(value)}

    def targets(variant: str, prefix: str) -> dict[str, Any]:
        first_extra = None
        first, torchrun_first = (summary.get(v, {}).get("time_to_first_step_s") for v in (variant, "torchrun"))
        if first and torchrun_first:
            first_extra = first - torchrun_first
        return {
            f"{prefix}_wall_over_raytrain_wall": target(
                ratio(variant, "raytrain", "wall_s"), f"<= {TARGET_WALL_RATIO}", lambda v: v <= TARGET_WALL_RATIO
            ),
            f"{prefix}_first_step_minus_torchrun_s": target(
                first_extra, f"<= +{TARGET_FIRST_STEP_EXTRA_S:g} s", lambda v: v <= TARGET_FIRST_STEP_EXTRA_S
            ),
            f"{prefix}_steps_per_s_over_torchrun": target(
                ratio(variant, "torchrun", "steady_steps_per_s"),
                f">= {TARGET_THROUGHPUT_RATIO}",
                lambda v: v >= TARGET_THROUGHPUT_RATIO,
            ),
            f"{prefix}_peak_rss_over_torchrun": target(
                ratio(variant, "torchrun", "peak_rss_bytes"), f"<= {TARGET_RSS_RATIO}", lambda v: v <= TARGET_RSS_RATIO
            ),
        }

    return {
        **targets("trainlib", "trainlib"),
        # The same script run by `python -m trainlib` (Ray and its workers' imports started before the script's).
        **targets("trainlib_launch", "launch"),
        "trainlib_time_to_first_step_over_raytrain": ratio("trainlib", "raytrain", "time_to_first_step_s"),
        "trainlib_outside_steps_over_raytrain": ratio("trainlib", "raytrain", "outside_steps_s"),
        "trainlib_peak_rss_over_raytrain": ratio("trainlib", "raytrain", "peak_rss_bytes"),
        # This checkout against --baseline's, on the same job in the same run.
        "trainlib_wall_over_baseline": ratio("trainlib", "trainlib_base", "wall_s"),
        "trainlib_outside_steps_over_baseline": ratio("trainlib", "trainlib_base", "outside_steps_s"),
        "trainlib_peak_rss_over_baseline": ratio("trainlib", "trainlib_base", "peak_rss_bytes"),
    }


def machine_info() -> dict[str, Any]:
    import ray
    import torch
    import torchvision

    return {
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "ray": ray.__version__,
        # ray.init() without an address joins a cluster started by `ray start` if this file exists.
        "ray_current_cluster_file_present": os.path.exists(
            os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
        ),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty_files": len(_git("status", "--porcelain").splitlines()),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    s, r, settings = report["summary"], report["ratios"], report["settings"]
    lines = [
        f"Tutorial job (ResNet18, FashionMNIST, batch 128 per worker), {settings['steps']} steps per worker, "
        f"median of {settings['repeats']} fresh-process runs per variant; steady state skips the first "
        f"{settings['warmup_steps']} steps. {report['machine']['logical_cpus']} CPUs, torch "
        f"{report['machine']['torch']}, ray {report['machine']['ray']}.",
        "",
        "| variant | workers | wall s | time to first step s | steady steps/s | samples/s | wall outside steps s "
        "| peak RSS (tree) GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, row in s.items():
        samples = None if row["steady_steps_per_s"] is None else row["steady_steps_per_s"] * 128 * row["world_size"]
        name = row["framework"] or row["label"]
        if sum(1 for other in s.values() if other["framework"] == row["framework"]) > 1:
            name = f"{name} ({v})"  # the same framework run two ways (trainlib_launch, trainlib_base)
        failed = f" ({row['runs_failed']} failed)" if row["runs_failed"] else ""
        lines.append(
            f"| {name}{failed} | {row['world_size'] or 'n/a'} | {_fmt(row['wall_s'], '.1f')} | "
            f"{_fmt(row['time_to_first_step_s'], '.1f')} | {_fmt(row['steady_steps_per_s'], '.2f')} | "
            f"{_fmt(samples, '.0f')} | {_fmt(row['outside_steps_s'], '.1f')} | {_fmt(None if row['peak_rss_bytes'] is None else row['peak_rss_bytes'] / 1e9, '.2f')} |"
        )

    def verdict(x: dict[str, Any]) -> str:
        return "n/a" if x["met"] is None else ("met" if x["met"] else "MISSED")

    lines += ["", "| target (issue 14) | measured | target | |", "|---|---|---|---|"]
    rows = [
        ("wall_over_raytrain_wall", "wall / Ray Train wall", ".2f"),
        ("first_step_minus_torchrun_s", "time to first step - torchrun's, s", "+.1f"),
        ("steps_per_s_over_torchrun", "steady steps/s / torchrun's", ".3f"),
        ("peak_rss_over_torchrun", "peak RSS / torchrun's", ".2f"),
    ]
    ways = [("trainlib", "trainlib")] + ([("launch", "`python -m trainlib`:")] if "trainlib_launch" in s else [])
    for prefix, who in ways:
        for key, label, spec in rows:
            x = r[f"{prefix}_{key}"]
            lines.append(f"| {who} {label} | {_fmt(x['value'], spec)} | {x['target']} | {verdict(x)} |")
    lines.append(
        f"| trainlib / Ray Train, wall outside the steps | "
        f"{_fmt(r['trainlib_outside_steps_over_raytrain'], '.2f')} | (no target) | |"
    )
    if r.get("trainlib_wall_over_baseline") is not None:
        lines.append(
            f"| trainlib / trainlib before (--baseline): wall, outside the steps, peak RSS | "
            f"{_fmt(r['trainlib_wall_over_baseline'], '.2f')}, "
            f"{_fmt(r['trainlib_outside_steps_over_baseline'], '.2f')}, "
            f"{_fmt(r['trainlib_peak_rss_over_baseline'], '.2f')} | (no target) | |"
        )
    lines += [
        "",
        "Where the wall time goes (median seconds from process start):",
        "",
        "| variant | imports done | train_func entered | first step | last step | checkpoint report | last step to exit "
        "| CPU s: training processes / others | others' CPU share in steady state |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, row in s.items():
        p = row["phases_s"]
        if not p:
            continue
        lines.append(
            f"| {v} | {p['imports_done']:.1f} | {p['train_func_enter']:.1f} | {p['first_step_start']:.1f} | "
            f"{p['last_step_end']:.1f} | {p['report_s']:.2f} | {p['after_last_step_to_exit']:.1f} | "
            f"{_fmt(row.get('cpu_s_training'), '.0f')} / {_fmt(row.get('cpu_s_other'), '.0f')} | "
            f"{_fmt(None if row.get('steady_cpu_share_other') is None else 100 * row['steady_cpu_share_other'], '.1f')}% |"
        )
    lb, la = report["load_average_before"], report["load_average_after"]
    lines += [
        "",
        f"Load average (1/5/15 min) before: {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}, after: "
        f"{la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}. Peak RSS sums every process of the job's tree (for Ray: driver, "
        "GCS, raylet, agents, workers), so shared library pages count once per process.",
    ]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], results_dir: str, name: str = "overhead") -> str:
    """Write ``<results_dir>/<name>.{json,md}`` (the latest run only) and return the tables."""
    table = markdown(report)
    header = (
        "# Overhead benchmark\n\nReproduce: `python -m bench overhead` (= `python bench/bench_overhead.py`); this file "
        f"was written by `{report['command']}` on {report['created']}.\n"
    )
    write_results(results_dir, name, report, [header, table.rstrip("\n")])
    return table


def rebuild(path: str, results_dir: str, name: str = "overhead") -> int:
    """Recompute the summary of a saved report (e.g. after changing the tables), from its raw runs."""
    with open(path) as f:
        report = json.load(f)
    for run in report["runs"]:
        if "error" not in run and "outside_steps_s" not in run:
            p = run["phases_s"]
            run["outside_steps_s"] = run["wall_s"] - (p["last_step_end"] - p["first_step_start"])
        # Runs recorded before process_label kept the last readable name: a process sampled while
        # exiting got the fallback label "python", so its CPU split is unknown. Leave it out.
        if "python" in run.get("cpu_s_by_process", {}):
            run["cpu_split_unknown"] = True
            run["cpu_s_training"] = run["cpu_s_other"] = run["steady_cpu_share_other"] = None
    report["summary"] = summarise(report["runs"], report["settings"]["variants"])
    report["ratios"] = ratios(report["summary"])
    write_report(report, results_dir, name)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rebuild:
        return rebuild(args.rebuild, args.results_dir, args.name)
    from tasks.domain.torchvision_layout import torchvision_layout

    load_before = os.getloadavg()
    workdir = tempfile.mkdtemp(prefix="trainlib-bench-")
    try:
        data_root = os.path.join(workdir, "data")
        torchvision_layout(args.data, data_root)
        # Warm the page cache for the libraries every job imports, so the first run is not the only cold one.
        subprocess.run(
            [sys.executable, "-c", "import torch, torchvision, ray, ray.train.torch, trainlib.torch"],
            cwd=REPO,
            env=job_env(),
            check=True,
        )
        runs = []
        index = 0
        for repeat in range(args.repeats):
            shift = repeat % len(args.variants)
            for variant in args.variants[shift:] + args.variants[:shift]:  # rotated, to spread noise
                record = run_once(variant, args, data_root, workdir, index)
                record["repeat"] = repeat
                runs.append(record)
                index += 1
                status = (
                    "FAILED"
                    if "error" in record
                    else (
                        f"wall {record['wall_s']:.1f}s, first step {record['time_to_first_step_s']:.1f}s, "
                        f"{record['steady_steps_per_s']:.2f} steps/s, peak {record['peak_rss_bytes'] / 1e9:.2f} GB"
                    )
                )
                print(
                    f"[{repeat + 1}/{args.repeats}] {variant:13s} {status}, load "
                    f"{record['load_average_at_start'][0]:.1f}",
                    flush=True,
                )
                if "error" in record:
                    print(record["error"][-1500:], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarise(runs, args.variants)
    report = {
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(
            [
                os.path.relpath(sys.argv[0], REPO) if sys.argv else "bench/bench_overhead.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "settings": {
            "steps": args.steps,
            "repeats": args.repeats,
            "warmup_steps": args.warmup_steps,
            "batch_size_per_worker": 128,
            "variants": args.variants,
            "sample_interval_s": args.sample_interval,
        },
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "summary": summary,
        "ratios": ratios(summary),
        "runs": runs,
        "peak_rss_includes": "the job's process and every descendant seen while it ran (Ray: driver, gcs_server, "
        "raylet, dashboard/agents, log monitor, Ray Train controller, worker processes; "
        "torchrun: launcher and its 2 ranks)",
    }
    write_report(report, args.results_dir, args.name)
    return 0 if all(row["runs_failed"] == 0 for row in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
