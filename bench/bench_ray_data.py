"""Ray Data benchmark: the tutorial job fed by a DataLoader vs by Ray Data, on trainlib and on Ray Train.

    python bench/bench_ray_data.py                     # 40 steps, 1 run per variant
    python bench/bench_ray_data.py --steps 60 --repeats 3

Each variant is a fresh process (bench/jobs/data_job.py) training the tutorial's ResNet18 on the real
FashionMNIST with 2 workers for ``--steps`` steps of 128 images per worker. Measured as in
bench/bench_overhead.py: steady-state samples/s from rank 0's step times (the first ``--warmup-steps``
left out) and the peak summed RSS of the job's whole process tree (driver, Ray's daemons, Ray Data's
tasks and actors, the workers). Writes ``<results-dir>/ray_data.json`` and ``ray_data.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from overhead_jobs import JOBS, REPO, job_env
from overhead_report import machine_info
from process_tree import wait_sampled
from results_files import write_results

VARIANTS = {
    "trainlib-dataloader": ("trainlib", "dataloader"),
    "trainlib-raydata": ("trainlib", "raydata"),
    "raytrain-raydata": ("raytrain", "raydata"),
    "raytrain-dataloader": ("raytrain", "dataloader"),
}
BATCH = 128
WORKERS = 2


def run_once(variant: str, args: argparse.Namespace, data_root: str, workdir: str, index: int) -> dict:
    framework, feed = VARIANTS[variant]
    run_dir = os.path.join(workdir, f"{index:03d}_{variant}")
    out, storage = os.path.join(run_dir, "out"), os.path.join(run_dir, "storage")
    os.makedirs(out)
    os.makedirs(storage)
    cmd = [
        sys.executable,
        os.path.join(JOBS, "data_job.py"),
        "--framework",
        framework,
        "--input",
        feed,
        "--steps",
        str(args.steps),
        "--data-root",
        data_root,
        "--storage",
        storage,
        "--out",
        out,
    ]
    with open(os.path.join(run_dir, "log.txt"), "wb") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=log, stderr=subprocess.STDOUT)
        rc, t_exit, sampler = wait_sampled(proc, 0.2, args.timeout)
        wall = t_exit - t0
    sampler.end_leftovers(grace_s=10.0)
    record = {"variant": variant, "returncode": rc, "wall_s": wall, "peak_rss_bytes": sampler.peak_bytes}
    rank0 = os.path.join(out, "rank0.json")
    if rc != 0 or not os.path.exists(rank0):
        with open(os.path.join(run_dir, "log.txt"), "rb") as f:
            record["error"] = f.read()[-3000:].decode(errors="replace")
        return record
    with open(rank0) as f:
        ends = json.load(f)["step_ends"]
    intervals = [b - a for a, b in zip(ends, ends[1:])][args.warmup_steps :]
    record["samples_per_s"] = BATCH * WORKERS / statistics.median(intervals)
    record["time_to_first_step_s"] = ends[0] - t0
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--data", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    from tasks.domain.torchvision_layout import torchvision_layout

    workdir = tempfile.mkdtemp(prefix="trainlib-bench-data-")
    runs = []
    load_before = os.getloadavg()
    try:
        data_root = os.path.join(workdir, "data")
        torchvision_layout(args.data, data_root)
        for repeat in range(args.repeats):
            for variant in variants[repeat % len(variants) :] + variants[: repeat % len(variants)]:
                record = run_once(variant, args, data_root, workdir, len(runs))
                runs.append(record)
                print(
                    variant,
                    {k: v for k, v in record.items() if k != "error"},
                    record.get("error", "")[-800:],
                    flush=True,
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for variant in variants:
        ok = [r for r in runs if r["variant"] == variant and "error" not in r]
        rows.append(
            {
                "variant": variant,
                "runs": len(ok),
                "samples_per_s": statistics.median(r["samples_per_s"] for r in ok) if ok else None,
                "time_to_first_step_s": statistics.median(r["time_to_first_step_s"] for r in ok) if ok else None,
                "wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
                "peak_rss_gb": statistics.median(r["peak_rss_bytes"] for r in ok) / 1e9 if ok else None,
            }
        )
    report = {
        "settings": {
            "steps": args.steps,
            "repeats": args.repeats,
            "warmup_steps": args.warmup_steps,
            "batch_per_worker": BATCH,
            "workers": WORKERS,
        },
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "summary": rows,
        "runs": runs,
    }
    lines = [
        "# Ray Data vs DataLoader on the tutorial job",
        "",
        f"Reproduce: `python bench/bench_ray_data.py --steps {args.steps} --repeats {args.repeats}`. ResNet18 on the real FashionMNIST, 2 workers x batch {BATCH}, {args.steps} steps, "
        f"median of {args.repeats} fresh-process run(s); steady state skips {args.warmup_steps} steps. "
        f"Load average before/after: {load_before[0]:.2f} / {report['load_average_after'][0]:.2f}.",
        "",
        "| variant | samples/s (steady) | time to first step s | wall s | peak RSS of the job's tree GB |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [
            f"{row[k]:.1f}" if isinstance(row[k], float) else "FAILED"
            for k in ("samples_per_s", "time_to_first_step_s", "wall_s")
        ]
        peak = f"{row['peak_rss_gb']:.2f}" if row["peak_rss_gb"] else "FAILED"
        lines.append(f"| {row['variant']} | {' | '.join(cells)} | {peak} |")
    write_results(args.results_dir, "ray_data", report, lines)
    return 0 if all(r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
