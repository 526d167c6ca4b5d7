"""Benchmark of the whole pipeline on the real FashionMNIST (not run in CI: it trains for real).

    python bench/bench_pipeline.py --epochs 1 --epochs 10 [--recipe augmented|tutorial] [--mirror ../shared/datasets/fashion-mnist]

For each epoch count, one pipeline run as `make run` does it (embedded Prefect server, local Ray,
MLflow SQLite store, the tutorial's settings: ResNet18, Adam 1e-3, batch 128 per worker, 2
workers): the seconds of every stage, training's own `fit()` time, the pipeline's overhead beyond
it, and the test accuracy reached. Writes bench/results/pipeline.json and pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, action="append", default=None)
    parser.add_argument("--mirror", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="first N training images only (smoke runs)")
    parser.add_argument("--recipe", default="augmented", choices=["augmented", "tutorial"])
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()
    epochs_list = args.epochs or [1, 10]

    from flows.params import PipelineParams
    from flows.prefect_server import ensure_prefect
    from tasks.domain.home import HOME_ENV_VAR, PipelineHome

    os.environ[HOME_ENV_VAR] = tempfile.mkdtemp(prefix="trainlib_pipeline_bench_")
    home = PipelineHome.resolve()
    server = ensure_prefect(home, port=_free_port())
    how = server.how
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
    from flows.pipeline import training_pipeline

    runs = []
    for epochs in epochs_list:
        started = time.perf_counter()
        summary = training_pipeline(PipelineParams(
            mirrors=[os.path.abspath(args.mirror)], epochs=epochs, num_workers=args.num_workers,
            experiment_name="bench", model_name=f"bench-{epochs}ep", limit=args.limit, test_limit=args.limit,
            recipe=args.recipe))
        wall = time.perf_counter() - started
        stages = summary["stage_seconds"]
        runs.append({
            "epochs": epochs, "recipe": args.recipe, "limit": args.limit, "pipeline_wall_s": wall, "stage_seconds": stages, "fit_seconds": summary["fit_seconds"],
            "overhead_beyond_fit_s": wall - summary["fit_seconds"], "test_accuracy": summary["test_accuracy"],
            "test_loss": summary["test_loss"], "training_metrics": summary["training_metrics"],
        })
        print(json.dumps(runs[-1], indent=1), flush=True)
    machine = {"cores": os.cpu_count(), "python": platform.python_version(), "load_avg_after": os.getloadavg()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pipeline.json"), "w") as f:
        json.dump({"machine": machine, "prefect_server": how, "runs": runs}, f, indent=1)
    lines = ["| epochs | pipeline wall (s) | download | train task | evaluate | register | trainlib fit() (s) "
             "| overhead beyond fit() (s) | test accuracy |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r["stage_seconds"]
        lines.append(f"| {r['epochs']} | {r['pipeline_wall_s']:.0f} | {s['download']:.1f} | {s['train']:.0f} | "
                     f"{s['evaluate']:.1f} | {s['register']:.1f} | {r['fit_seconds']:.0f} | "
                     f"{r['overhead_beyond_fit_s']:.0f} | {100 * r['test_accuracy']:.2f}% |")
    with open(os.path.join(args.out, "pipeline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
