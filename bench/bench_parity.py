"""Accuracy parity: FashionMNIST through the folder source against the same images through the idx files.

    python bench/bench_parity.py [--epochs 2] [--mirror ../shared/datasets/fashion-mnist]

Two pipeline runs in one fresh home (embedded Prefect server, local Ray, MLflow's SQLite store), the same recipe,
epochs, seed, workers and batch size: ``data="fashion-mnist"`` read from the idx mirror, and ``data=<folder>``,
the 70,000 PNGs that examples/fashion_mnist_to_folder.py writes from those idx files (``train/`` and ``test/``,
the folder bench_data.py uses). Both are evaluated on their own test split: the same 10,000 images. Target:
test accuracies within 0.3 points. The two runs see the images in different orders (the idx file's order
against the snapshot's path order), so the difference is what the data path plus shuffling noise costs.
Writes bench/results/parity.json and parity.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from bench_data import write_source
from bench_pipeline import start_fresh_home
from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MIRROR = os.path.join(os.path.dirname(REPO), "shared", "datasets", "fashion-mnist")
TARGET_POINTS = 0.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mirror", default=MIRROR)
    parser.add_argument("--workdir", default="/tmp/trainlib-bench-data", help="where the folder source is written")
    parser.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()

    folder = os.path.join(args.workdir, "fashion-folder")
    write_source(folder, None)
    server = start_fresh_home()
    from flows.params import PipelineParams
    from flows.pipeline import training_pipeline

    common = {"epochs": args.epochs, "num_workers": 2, "experiment_name": "parity"}
    runs = {}
    try:
        for label, data in (("idx files", "fashion-mnist"), ("folder source", folder)):
            started = time.perf_counter()
            params = PipelineParams(data=data, mirrors=[args.mirror], model_name=f"parity-{label.split()[0]}", **common)
            summary = training_pipeline(params)
            runs[label] = {
                "data": data,
                "test_accuracy": summary.test_accuracy,
                "fit_s": summary.fit_seconds,
                "wall_s": time.perf_counter() - started,
                "data_digest": summary.data_digest,
            }
            print(label, runs[label], flush=True)
    finally:
        if server.pid:
            os.kill(server.pid, 15)

    gap = 100 * abs(runs["folder source"]["test_accuracy"] - runs["idx files"]["test_accuracy"])
    payload = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()},
        "epochs": args.epochs,
        "runs": runs,
        "gap_points": gap,
        "target_points": TARGET_POINTS,
    }
    lines = [
        f"# Accuracy parity: folder source vs idx files ({args.epochs} epoch(s), default recipe, 2 workers, "
        f"{os.cpu_count()} CPUs, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)",
        "",
        "| data | test accuracy (10,000 images) | fit (s) | pipeline wall (s) |",
        "|---|---|---|---|",
    ]
    for label, run in runs.items():
        lines.append(f"| {label} | {100 * run['test_accuracy']:.2f}% | {run['fit_s']:.0f} | {run['wall_s']:.0f} |")
    verdict = "met" if gap <= TARGET_POINTS else "MISSED"
    lines += ["", f"Gap: {gap:.2f} points (target <= {TARGET_POINTS}: {verdict})."]
    write_results(args.results_dir, "parity", payload, lines)


if __name__ == "__main__":
    main()
