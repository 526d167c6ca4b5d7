"""Where the seconds before the first training step go: trainlib's job and torchrun's, traced process by process.

    python bench/trace_startup.py [--repeats 3] [--data ../shared/datasets/fashion-mnist]

Runs the overhead benchmark's tutorial job (bench/jobs/, 3 steps, 2 workers) on trainlib and on torchrun,
alternately, in fresh processes, with ``bench/startup_trace/sitecustomize.py`` in every process of the job
(the driver or torchrun's launcher, and each worker): it records when each process starts, when torch,
torchvision and Ray begin and finish importing, and trainlib's own steps (``ray.init``, the workers' actor
start). Prints, and writes to bench/results/startup_trace.{json,md}, the median second (from the driver's
or the launcher's first line of Python) at which each phase ends. Worker phases are the slower rank's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from overhead_jobs import DATA, REPO, command, job_env
from results_files import RESULTS, write_results

TRACER = os.path.join(REPO, "bench", "startup_trace")

# (label, variant it applies to or None for both, how to find its time in a run's events)
PHASES = (
    ("driver (trainlib) or launcher (torchrun): torch imported", None, ("main", "imported torch")),
    ("driver: the job's modules imported (torchvision)", "trainlib", ("main", "imported torchvision")),
    ("driver: ray.init called", "trainlib", ("main", "call ray.init")),
    ("driver: ray.init returned", "trainlib", ("main", "return ray.init")),
    ("workers: Python started", None, ("workers", "process")),
    ("workers: ray imported", "trainlib", ("workers", "imported ray")),
    ("workers: torch imported", None, ("workers", "imported torch")),
    ("workers: actor created", "trainlib", ("workers", "call TrainWorker.__init__")),
    ("workers: torchvision imported", None, ("workers", "imported torchvision")),
    ("first step started (rank 0)", None, ("rank0", "first_step_start")),
)


def read_events(trace_dir: str) -> dict[int, list[tuple[float, str]]]:
    """pid -> [(time, event)] from the tracer's files."""
    events = {}
    for path in glob.glob(os.path.join(trace_dir, "*.log")):
        with open(path) as f:
            rows = [line.rstrip("\n").split(" ", 1) for line in f if " " in line]
        events[int(os.path.basename(path)[:-4])] = [(float(t), text) for t, text in rows]
    return events


def phases_of_run(variant: str, trace_dir: str, out: str) -> dict[str, float]:
    """Seconds from the main process's first line of Python to the end of each phase, for one run."""
    events = read_events(trace_dir)
    # The main process is the first to start; the workers are those that imported the job's module.
    main_pid = min(events, key=lambda pid: events[pid][0][0])
    t0 = events[main_pid][0][0]
    workers = [
        pid for pid, rows in events.items() if pid != main_pid and any(e == "imported torchvision" for _, e in rows)
    ]
    with open(os.path.join(out, "rank0.json")) as f:
        rank0 = json.load(f)

    def first(pid: int, text: str) -> float | None:
        return next((t for t, e in events[pid] if e == text), None)

    result = {}
    for label, only, (where, text) in PHASES:
        if only not in (None, variant):
            continue
        if where == "main":
            found = first(main_pid, text)
        elif where == "rank0":
            found = rank0[text]
        else:
            times = [first(pid, text) for pid in workers]
            found = max(times) if times and None not in times else None
        if found is not None:
            result[label] = round(found - t0, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=DATA, help="folder with FashionMNIST's four .gz files")
    parser.add_argument("--results-dir", default=RESULTS)
    args = parser.parse_args()
    from tasks.domain.torchvision_layout import torchvision_layout

    workdir = tempfile.mkdtemp(prefix="trainlib-trace-")
    runs: dict[str, list[dict[str, float]]] = {"trainlib": [], "torchrun": []}
    load_before = os.getloadavg()
    try:
        data_root = os.path.join(workdir, "data")
        torchvision_layout(args.data, data_root)
        for index in range(args.repeats):
            for variant in ("trainlib", "torchrun") if index % 2 == 0 else ("torchrun", "trainlib"):
                run_dir = os.path.join(workdir, f"{index}_{variant}")
                trace_dir, out, storage = (os.path.join(run_dir, name) for name in ("trace", "out", "storage"))
                for folder in (trace_dir, out, storage):
                    os.makedirs(folder)
                env = job_env()
                env["PYTHONPATH"] = os.pathsep.join([TRACER, env["PYTHONPATH"]])
                env["TRAINLIB_TRACE_DIR"] = trace_dir
                with open(os.path.join(run_dir, "log.txt"), "wb") as log:
                    subprocess.run(
                        command(variant, 3, data_root, storage, out),
                        cwd=REPO,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        check=True,
                        timeout=600,
                    )
                runs[variant].append(phases_of_run(variant, trace_dir, out))
                print(
                    f"[{index + 1}/{args.repeats}] {variant}: first step at "
                    f"{runs[variant][-1].get('first step started (rank 0)', float('nan')):.2f} s",
                    flush=True,
                )
                time.sleep(1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def median(variant: str, label: str) -> str:
        values = [run[label] for run in runs[variant] if label in run]
        return f"{statistics.median(values):.2f}" if values else ""

    lines = [
        "# Start-up, phase by phase",
        "",
        f"Reproduce: `python bench/trace_startup.py --repeats {args.repeats}`. The tutorial job, 3 steps, "
        f"2 workers, {args.repeats} alternated fresh-process runs per variant; median second, from the "
        "driver's (trainlib) or the launcher's (torchrun) first line of Python, at which each phase ended; "
        "worker phases are the slower rank's. The tracer adds its own small cost to every import.",
        "",
        "| phase ended | trainlib | torchrun |",
        "|---|---|---|",
    ]
    lines += [f"| {label} | {median('trainlib', label)} | {median('torchrun', label)} |" for label, _, _ in PHASES]
    lines += ["", f"{os.cpu_count()} cores; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}."]
    write_results(
        args.results_dir,
        "startup_trace",
        {"runs": runs, "load_before": load_before, "load_after": os.getloadavg()},
        lines,
    )


if __name__ == "__main__":
    sys.exit(main())
