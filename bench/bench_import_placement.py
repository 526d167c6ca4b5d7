"""Time to the first step with torchvision imported by the driver (as the tutorial does) or only by the workers.

Reproduce: ``python bench/bench_import_placement.py --pairs 5``. Runs bench/jobs/import_placement_job.py (the
tutorial's job on trainlib, 3 steps, 2 workers) in fresh processes, the two variants alternated, and writes
``bench/results/import_placement.{md,json}``. Why it matters: torchvision 0.29's import costs ~1.6 s, ~1.45 s
of it ``torch._dynamo`` (``torchvision.ops.roi_align`` imports ``torch._dynamo.utils``), and a driver that
imports it does so before ``fit()`` starts Ray, with the other core idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_overhead import DATA, JOBS, REPO, RESULTS, job_env
from results_files import write_results

VARIANTS = {"driver imports torchvision": ["--driver-imports", "torchvision"], "workers only": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--data", default=DATA, help="folder with FashionMNIST's four .gz files")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--name", default="import_placement")
    args = parser.parse_args()
    from tasks.domain.torchvision_layout import torchvision_layout

    workdir = tempfile.mkdtemp(prefix="trainlib-imports-")
    data_root = os.path.join(workdir, "data")
    torchvision_layout(args.data, data_root)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for index in range(args.pairs):
        order = list(VARIANTS) if index % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            command = [
                sys.executable,
                os.path.join(JOBS, "import_placement_job.py"),
                "--data-root",
                data_root,
                "--storage",
                os.path.join(workdir, "runs"),
                *VARIANTS[variant],
            ]
            done = subprocess.run(command, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {
        v: {k: statistics.median(r[k] for r in rs) for k in ("first_step_s", "fit_end_s")} for v, rs in runs.items()
    }
    lines = [
        f"# Where the job imports torchvision ({started})",
        "",
        f"Reproduce: `python bench/bench_import_placement.py --pairs {args.pairs}`. The tutorial's job on trainlib "
        "(ResNet18, FashionMNIST, batches of 128, 3 steps, 2 workers), fresh processes, the two variants alternated; "
        "seconds from the script's first line.",
        "",
        "| torchvision imported by | first step (median) | end of fit() (median) | first step, each run |",
        "|---|---|---|---|",
    ]
    for variant, rs in runs.items():
        each = ", ".join(f"{r['first_step_s']:.2f}" for r in rs)
        lines.append(
            f"| {variant} | {medians[variant]['first_step_s']:.2f} | {medians[variant]['fit_end_s']:.2f} | {each} |"
        )
    lines += ["", f"{os.cpu_count()} CPUs; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}."]
    write_results(args.results_dir, args.name, {"started": started, "runs": runs, "medians": medians}, lines)


if __name__ == "__main__":
    main()
