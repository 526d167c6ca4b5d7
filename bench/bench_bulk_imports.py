"""What CPython's cyclic collector costs a training worker's imports, and what pausing it saves (bulk_imports.py).

    python bench/bench_bulk_imports.py [--repeats 6]

Each run is a fresh process that imports what a worker of trainlib's embedded Ray imports, in the same order: ray
(before the preload, as Ray's worker does), then the preload (torch, torch.distributed, trainlib's worker module),
then what unpickling the tutorial job's training function imports (its ``common`` module: torchvision). It
measures the CPU seconds of each phase (the process's own clock, so the machine's other load matters less)
with the collector as CPython has it ("on") and paused around each phase as a worker of the embedded Ray does
now ("paused": ``bulk_imports.pause``/``resume`` around the preload, ``collector_paused`` around the
function's modules; their collection and freeze are counted in each phase). The two modes alternate; medians.
Writes bench/results/bulk_imports.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from overhead_jobs import job_env
from results_files import RESULTS, write_results

PROBE = r"""
import contextlib, json, sys, time
import ray  # Ray's worker imports it before its preload
from trainlib._internal.startup import bulk_imports
paused = sys.argv[1] == "paused"
c0 = time.process_time()
if paused:
    bulk_imports.pause()
import torch, torch.distributed, trainlib._internal.execution.worker
if paused:
    bulk_imports.resume()
c1 = time.process_time()
with bulk_imports.collector_paused() if paused else contextlib.nullcontext():
    import common  # the tutorial job's module: torchvision
c2 = time.process_time()
print(json.dumps({"preload_cpu_s": c1 - c0, "function_modules_cpu_s": c2 - c1}))
"""

MODES = ("on", "paused")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--results-dir", default=RESULTS)
    args = parser.parse_args()
    env = job_env()  # the jobs' own: bench/jobs (the job's common module) and this checkout on the path
    runs = []
    load_before = os.getloadavg()
    for index in range(args.repeats * len(MODES)):
        mode = MODES[(index + index // len(MODES)) % len(MODES)]  # alternate, and swap who goes first each pair
        out = subprocess.run(
            [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, check=True, timeout=300
        )
        runs.append({"mode": mode, **json.loads(out.stdout.strip().splitlines()[-1])})
        print(runs[-1], flush=True)
    medians = {
        mode: {
            key: statistics.median(r[key] for r in runs if r["mode"] == mode)
            for key in ("preload_cpu_s", "function_modules_cpu_s")
        }
        for mode in MODES
    }
    for figures in medians.values():
        figures["total_cpu_s"] = figures["preload_cpu_s"] + figures["function_modules_cpu_s"]
    lines = [
        "# A worker's imports with CPython's cyclic collector on and paused (bulk_imports.py)",
        "",
        f"Reproduce: `python bench/bench_bulk_imports.py --repeats {args.repeats}`. Fresh processes, modes alternated; "
        f"medians of {args.repeats}; CPU seconds of the process. {os.cpu_count()} cores; load average before "
        f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}.",
        "",
        "| collector | preload (torch, torch.distributed, worker module), CPU s "
        "| the function's modules (torchvision), CPU s | both, CPU s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {mode} | {m['preload_cpu_s']:.3f} | {m['function_modules_cpu_s']:.3f} | {m['total_cpu_s']:.3f} |"
        for mode, m in medians.items()
    ]
    saved = medians["on"]["total_cpu_s"] - medians["paused"]["total_cpu_s"]
    lines += [
        "",
        f"Paused saves {saved:.2f} CPU s a worker ({saved / medians['on']['total_cpu_s']:.0%}), including "
        "its two collections before the freezes.",
    ]
    write_results(args.results_dir, "bulk_imports", {"runs": runs, "medians": medians}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
