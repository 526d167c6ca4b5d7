"""Accuracy parity: FashionMNIST through the folder source against the same images through the idx files.

    python bench/bench_parity.py [--epochs 2] [--mirror ../shared/datasets/fashion-mnist]

Two pipeline runs in one fresh home (embedded Prefect server, local Ray, MLflow's SQLite store), the same recipe,
epochs, seed, workers and batch size: ``data="fashion-mnist"`` read from the idx mirror, and ``data=<folder>``,
the 70,000 PNGs that examples/fashion_mnist_to_folder.py writes from those idx files (``train/`` and ``test/``,
the folder bench_data.py uses). Both are evaluated on their own test split: the same 10,000 images. Target:
test accuracies within 0.3 points. The two runs see the images in different orders (the idx file's order
against the snapshot's path order), so the difference is what the data path plus shuffling noise costs.
Writes its figures into bench/results/data.json and data.md (the data benchmark's third target).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from bench_data import read_data_results, render, write_source
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
    parity = {
        "epochs": args.epochs,
        "runs": runs,
        "gap_points": gap,
        "target_points": TARGET_POINTS,
        "load_average": os.getloadavg(),
    }
    # One results pair for the data benchmark: the listing and decoding figures stay as bench_data.py wrote them.
    payload = read_data_results(args.results_dir) or {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()}
    }
    payload["parity"] = parity
    write_results(args.results_dir, "data", payload, render(payload))


if __name__ == "__main__":
    main()
