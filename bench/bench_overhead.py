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

This file holds the options and the order of the runs; overhead_jobs.py the variants' commands and one
measured run, process_tree.py the process tree's sampling, overhead_report.py the medians, targets and tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its neighbours, also when loaded by path (tests)

from overhead_jobs import DATA, DEFAULT_VARIANTS, REPO, VARIANTS, job_env, run_once  # noqa: E402
from overhead_report import machine_info, ratios, rebuild, summarise, write_report  # noqa: E402
from results_files import RESULTS, check_name  # noqa: E402


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
