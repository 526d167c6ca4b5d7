"""The overhead benchmark's jobs: each variant's command and environment, and one measured run of it.

Runs in the benchmark's process (bench_overhead.py; the start-up trace, the bulk-imports and the Ray Data benchmarks
reuse the commands and the environment); every job is a fresh subprocess (bench/jobs/), its process tree sampled
while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "bench", "jobs")
DATA = os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist")  # the offline mirror beside the repository
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))  # its neighbours, also when a test loads this file by path

from process_tree import TRAINING_PROCESSES, wait_sampled  # noqa: E402

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
        rc, t_exit, sampler = wait_sampled(proc, args.sample_interval, args.timeout)
    leftovers = sampler.end_leftovers(grace_s=10.0)
    record: dict[str, Any] = {
        "variant": variant,
        "index": index,
        "returncode": rc,
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
