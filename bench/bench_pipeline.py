"""Benchmark of the whole pipeline on the real FashionMNIST (not run in CI: it trains for real).

    python bench/bench_pipeline.py --epochs 1 [--limit 2048] [--recipe augmented|tutorial] [--mirror ../shared/datasets/fashion-mnist]

For each epoch count, one pipeline run as `make run` does it (embedded Prefect server, local Ray,
MLflow SQLite store in a fresh home, the tutorial's settings: ResNet18, Adam 1e-3, batch 128 per
worker, 2 workers): the seconds of every stage, training's own `fit()` time, the pipeline's fixed
overhead beyond it, the test accuracy, and the CPU the embedded services used while the train step
ran (the Prefect server's process tree; Ray's own processes: GCS, raylet, agents, log monitor), as
a share of the machine. `--limit N` trains on N images only: the overhead is the same, the run is
short (use it on a busy machine, and say so). Writes bench/results/pipeline.json and pipeline.md
(`--tag` names another result, e.g. pipeline_10ep; `python -m bench pipeline_10ep`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time

from results_files import plain_name, write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

RAY_SERVICE_WORDS = ("gcs_server", "raylet", "log_monitor", "dashboard", "monitor.py", "runtime_env", "agent")
SAMPLE_S = 0.5


class CpuSampler:
    """Samples the cumulative CPU seconds of the Prefect server's tree and of Ray's service processes."""

    def __init__(self, server_pid: int | None):
        import psutil

        self.psutil = psutil
        self.server = psutil.Process(server_pid) if server_pid else None
        self.samples: list[tuple[float, float, float]] = []  # (time, prefect cpu s, ray services cpu s)
        self._stop = threading.Event()
        self._known: dict[int, tuple[str, float]] = {}  # pid -> (group, last cpu seconds): exited ones count
        self.names: dict[int, str] = {}  # pid -> the process's name, for the per-process breakdown
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _group(self, process) -> str | None:
        if self.server is not None and (
            process.pid == self.server.pid or self.server.pid in [p.pid for p in process.parents()]
        ):
            return "prefect"
        # Only this benchmark's own Ray (its processes descend from this one): the machine may run others.
        if os.getpid() not in [p.pid for p in process.parents()]:
            return None
        cmdline = " ".join(process.cmdline())
        # A Ray worker (the training, the task processes) starts as default_worker.py with
        # "--runtime-env-agent-port" in its arguments and renames itself ray::... later: not a service.
        if "default_worker.py" in cmdline or cmdline.startswith("ray::"):
            return None
        if any(word in cmdline for word in RAY_SERVICE_WORDS) and "ray" in cmdline:
            return "ray"
        return None

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for process in self.psutil.process_iter():
                try:
                    if process.pid not in self._known:
                        group = self._group(process)
                        if group is None:
                            self._known[process.pid] = ("", 0.0)
                            continue
                        self._known[process.pid] = (group, 0.0)
                        self.names[process.pid] = " ".join(process.cmdline())[:80]
                    group, _ = self._known[process.pid]
                    if group:
                        times = process.cpu_times()
                        self._known[process.pid] = (group, times.user + times.system)
                except self.psutil.Error:
                    continue
            totals = {"prefect": 0.0, "ray": 0.0}
            for group, seconds in self._known.values():
                if group:
                    totals[group] += seconds
            self.samples.append((time.time(), totals["prefect"], totals["ray"]))

    def cpu_seconds_by_process(self) -> dict[str, float]:
        """Total CPU seconds of each sampled service process over the whole run (name -> seconds)."""
        return {
            f"{self.names[pid]} ({pid})": round(seconds, 2) for pid, (group, seconds) in self._known.items() if group
        }

    def share_of_machine(self, start: float, end: float) -> dict[str, float]:
        """CPU share (0..1 of all cores) each group used between wall times ``start`` and ``end``."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {"prefect": float("nan"), "ray": float("nan")}
        (t0, p0, r0), (t1, p1, r1) = inside[0], inside[-1]
        capacity = (t1 - t0) * (os.cpu_count() or 1)
        return {"prefect": (p1 - p0) / capacity, "ray": (r1 - r0) / capacity, "seconds": t1 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, action="append", default=None)
    parser.add_argument("--mirror", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="first N training images only (busy machine)")
    parser.add_argument("--test-limit", type=int, default=None, help="first N test images only")
    parser.add_argument("--tag", type=plain_name, default="pipeline", help="results file name (default: %(default)s)")
    parser.add_argument(
        "--recipe",
        default="augmented",
        choices=["augmented", "tutorial"],
        help="training recipe (default: %(default)s)",
    )
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()
    epochs_list = args.epochs or [1]

    from flows.params import PipelineParams

    server = start_fresh_home()
    from flows.pipeline import training_pipeline

    runs = []
    try:
        for epochs in epochs_list:
            started = time.perf_counter()
            with CpuSampler(server.pid) as sampler:
                summary = training_pipeline(
                    PipelineParams(
                        mirrors=[os.path.abspath(args.mirror)],
                        epochs=epochs,
                        num_workers=args.num_workers,
                        experiment_name="bench",
                        model_name=f"bench-{epochs}ep",
                        limit=args.limit,
                        test_limit=args.test_limit,
                        recipe=args.recipe,
                    )
                )
            wall = time.perf_counter() - started
            train = summary.stage_times.train
            runs.append(
                {
                    "epochs": epochs,
                    "recipe": args.recipe,
                    "limit": args.limit,
                    "test_limit": args.test_limit,
                    "pipeline_wall_s": wall,
                    "stage_seconds": summary.stage_times.seconds(),
                    "fit_seconds": summary.fit_seconds,
                    "overhead_beyond_fit_s": wall - summary.fit_seconds,
                    "test_accuracy": summary.test_accuracy,
                    "test_loss": summary.test_loss,
                    "training_metrics": summary.training_metrics,
                    "services_cpu_share_while_training": sampler.share_of_machine(train.started_at, train.ended_at),
                    "services_cpu_seconds_whole_run": sampler.cpu_seconds_by_process(),
                }
            )
            print(json.dumps(runs[-1], indent=1), flush=True)
    finally:
        if server.pid:
            os.kill(server.pid, 15)
    machine = {"cores": os.cpu_count(), "python": platform.python_version(), "load_avg_after": os.getloadavg()}
    lines = [
        "| epochs | training images | pipeline wall (s) | download | train task | evaluate | register "
        "| trainlib fit() (s) | overhead beyond fit() (s) | Prefect server CPU while training "
        "| Ray services CPU while training | test accuracy |",
        "|---" * 12 + "|",
    ]
    for r in runs:
        s, cpu = r["stage_seconds"], r["services_cpu_share_while_training"]
        lines.append(
            f"| {r['epochs']} | {r['limit'] or 'all'} | {r['pipeline_wall_s']:.0f} | {s['download']:.1f} | "
            f"{s['train']:.0f} | {s['evaluate']:.1f} | {s['register']:.1f} | {r['fit_seconds']:.0f} | "
            f"{r['overhead_beyond_fit_s']:.0f} | {100 * cpu['prefect']:.1f}% | {100 * cpu['ray']:.1f}% | "
            f"{100 * r['test_accuracy']:.2f}% |"
        )
    lines.append(
        f"\nMachine: {machine['cores']} cores, load average after the run {machine['load_avg_after']}. "
        "CPU shares are of the whole machine (all cores)."
    )
    write_results(args.out, args.tag, {"machine": machine, "prefect_server": server.how, "runs": runs}, lines)


def start_fresh_home():
    """Point this process at a new pipeline home in $TMPDIR and start its Prefect server; return the server
    (:class:`flows.prefect_server.PrefectServer`; stop it with ``os.kill(server.pid, 15)``)."""
    from flows.prefect_server import ensure_prefect
    from tasks.domain.home import HOME_ENV_VAR, PipelineHome

    os.environ[HOME_ENV_VAR] = tempfile.mkdtemp(prefix="trainlib_pipeline_bench_")
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "TRAINLIB_STORAGE_PATH", "TRAINLIB_DATA_CACHE"):
        os.environ.pop(name, None)
    server = ensure_prefect(PipelineHome.resolve(), port=_free_port())
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
    return server


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
