"""How the driver's cost grows with the world size: 2, 8, 16, 32 workers on one local Ray.

    python bench/bench_scaling.py                            # 2 8 16 32 workers, 30 steps
    python bench/bench_scaling.py --sizes 2 8 --steps 20

Runs on the machine that calls it, in one driver process (this one) on an embedded Ray
(``ray.init(address="local")``, ``--cpus`` logical CPUs). Each worker holds
``--cpu-per-worker`` (0.05) CPUs, so 32 workers fit on a 2-core machine; the model is a
4x4 linear layer, each step one backward pass (gloo all-reduce of its gradients through
DDP) and one ``trainlib.report()``, with and without a small checkpoint (rank 0's
state_dict, ~1 KB). Per world size and mode, measured on the driver:

* ``first_step_s``: from ``fit()`` called to the last rank starting its first step
  (placement group, actor start, torch import, process group, DDP wrap);
* ``driver_rss_mb``: the driver's peak resident memory during the run, and its growth over
  the idle driver before the run;
* ``driver_cpu_ms_per_step``: the driver process's CPU time (all threads: trainlib's
  controller, Ray's core worker) from the first committed report to the last, per step
  (one report of every rank); ``..._per_worker`` divides it by the world size;
* ``commit_lag_ms``: from the last rank calling ``report()`` to the driver having committed
  that report (``Callback.after_report``), median and max over the steps.

The load of the machine (other processes) is recorded with the figures; on a shared
machine they are upper bounds. Writes ``bench/results/scaling.json`` and ``.md`` with the
growth per worker (least-squares slope) and a linear extrapolation to 512 workers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
sys.path.insert(0, REPO)

import trainlib  # noqa: E402


# -- the job (runs in the Ray workers) ------------------------------------------------------


def train_func(config: dict[str, Any]) -> None:
    """Tiny DDP model; every step reports, optionally with rank 0's ~1 KB state_dict as checkpoint."""
    import torch
    import torch.distributed as dist

    from trainlib.torch import prepare_model

    ctx = trainlib.get_context()
    rank = ctx.get_world_rank()
    model = prepare_model(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    previous_report_at = 0.0
    for step in range(1, config["steps"] + 1):
        if step == 1:  # the last rank to get here ends the start-up
            started = torch.tensor([time.time()], dtype=torch.float64)
            dist.all_reduce(started, op=dist.ReduceOp.MAX)
            first_step_at = float(started.item())
        opt.zero_grad()
        model(x).pow(2).mean().backward()  # DDP all-reduces the gradients
        opt.step()
        # The previous report's "last rank called report()" time, as every rank saw it.
        mark = torch.tensor([previous_report_at], dtype=torch.float64)
        dist.all_reduce(mark, op=dist.ReduceOp.MAX)
        metrics = {"step": step, "first_step_at": first_step_at, "previous_last_report_at": float(mark.item())}
        previous_report_at = time.time()
        if config["checkpoint"] and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.module.state_dict() if hasattr(model, "module") else model.state_dict(),
                           os.path.join(folder, "model.pt"))
                trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
        else:
            trainlib.report(metrics)


# -- the driver side ------------------------------------------------------------------------


class DriverProbe(trainlib.Callback):
    """Records, at each committed report, the time and this process's CPU time."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.commits: list[tuple[int, float, float, dict]] = []  # step, wall, cpu, metrics

    def after_report(self, run, report):
        cpu = self.process.cpu_times()
        self.commits.append((report.step, time.time(), cpu.user + cpu.system, dict(report.metrics)))


class PeakRss:
    """Samples this process's resident memory every 50 ms in a thread."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_one(world: int, steps: int, checkpoint: bool, cpu_per_worker: float, storage: str) -> dict[str, Any]:
    import psutil

    from trainlib.torch import TorchTrainer

    probe = DriverProbe()
    rss_before = psutil.Process().memory_info().rss
    trainer = TorchTrainer(
        train_func, train_loop_config={"steps": steps, "checkpoint": checkpoint},
        scaling_config=trainlib.ScalingConfig(num_workers=world, resources_per_worker={"CPU": cpu_per_worker},
                                              placement_timeout_s=300),
        run_config=trainlib.RunConfig(name=f"scaling-{world}-{'ckpt' if checkpoint else 'metrics'}",
                                      storage_path=storage, callbacks=[probe], if_exists="overwrite",
                                      checkpoint_config=trainlib.CheckpointConfig(num_to_keep=2)),
    )
    with PeakRss() as rss:
        fit_at = time.time()
        result = trainer.fit()
        fit_s = time.time() - fit_at
    if result.error is not None:
        raise RuntimeError(f"{world} workers: {result.error}")
    commits = sorted(probe.commits)
    first_step_s = commits[0][3]["first_step_at"] - fit_at
    # Steady state: from the first committed report to the last.
    cpu_s = commits[-1][2] - commits[0][2]
    per_step_ms = 1000 * cpu_s / (len(commits) - 1)
    lags = [1000 * (commits[i - 1][1] - commits[i][3]["previous_last_report_at"]) for i in range(1, len(commits))]
    wall_per_step_ms = 1000 * (commits[-1][1] - commits[0][1]) / (len(commits) - 1)
    return {
        "world_size": world, "checkpoint": checkpoint, "steps": steps, "fit_s": round(fit_s, 2),
        "first_step_s": round(first_step_s, 2),
        "driver_rss_mb": round(rss.peak / 2**20, 1), "driver_rss_growth_mb": round((rss.peak - rss_before) / 2**20, 1),
        "driver_cpu_ms_per_step": round(per_step_ms, 2),
        "driver_cpu_ms_per_step_per_worker": round(per_step_ms / world, 3),
        "wall_ms_per_step": round(wall_per_step_ms, 1),
        "commit_lag_ms_median": round(statistics.median(lags), 1), "commit_lag_ms_max": round(max(lags), 1),
    }


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x; returns (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def machine_load() -> dict[str, Any]:
    import psutil

    return {"loadavg_1_5_15": [round(v, 2) for v in os.getloadavg()], "cpus": os.cpu_count(),
            "memory_available_gb": round(psutil.virtual_memory().available / 2**30, 1)}


def write_results(rows: list[dict], args: argparse.Namespace, load: dict[str, list]) -> None:
    growth: dict[str, dict] = {}
    for checkpoint in (False, True):
        mode = "checkpoint" if checkpoint else "metrics"
        sel = [r for r in rows if r["checkpoint"] == checkpoint]
        if len(sel) < 2:
            continue
        xs = [r["world_size"] for r in sel]
        growth[mode] = {}
        for key in ("first_step_s", "driver_rss_mb", "driver_cpu_ms_per_step", "commit_lag_ms_median"):
            a, b = slope(xs, [r[key] for r in sel])
            growth[mode][key] = {"intercept": round(a, 3), "per_worker": round(b, 4), "at_512": round(a + b * 512, 1)}
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "args": vars(args),
           "load_before_after": load, "rows": rows, "growth": growth}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "scaling.json"), "w") as f:
        json.dump(out, f, indent=2)
    lines = [
        "# Driver cost as the world grows (bench/bench_scaling.py)", "",
        f"{out['date']}, {args.cpus} logical CPUs for Ray on a {os.cpu_count()}-core machine, "
        f"{args.cpu_per_worker} CPU per worker, {args.steps} steps, report() every step. Machine load "
        f"(1/5/15-min load average) before: {load['before']}, after: {load['after']}: the machine is shared, "
        "so these are upper bounds.", "",
        "| workers | mode | fit() to first step (s) | driver peak RSS (MB) | driver CPU per step (ms) "
        "| per worker (ms) | last report to commit, median / max (ms) | wall per step (ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['world_size']} | {'checkpoint' if r['checkpoint'] else 'metrics'} | {r['first_step_s']} "
                     f"| {r['driver_rss_mb']} | {r['driver_cpu_ms_per_step']} "
                     f"| {r['driver_cpu_ms_per_step_per_worker']} | {r['commit_lag_ms_median']} / "
                     f"{r['commit_lag_ms_max']} | {r['wall_ms_per_step']} |")
    lines += ["", "Growth per added worker (least-squares slope over the world sizes) and linear extrapolation "
              "to 512 workers:", "", "| mode | quantity | per worker | at 512 workers |", "|---|---|---:|---:|"]
    for mode, quantities in growth.items():
        for key, g in quantities.items():
            lines.append(f"| {mode} | {key} | {g['per_worker']} | {g['at_512']} |")
    with open(os.path.join(RESULTS, "scaling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cpus", type=float, default=2)
    parser.add_argument("--cpu-per-worker", type=float, default=0.05)
    parser.add_argument("--modes", nargs="+", default=["metrics", "checkpoint"], choices=["metrics", "checkpoint"])
    args = parser.parse_args()

    import ray

    load = {"before": machine_load()["loadavg_1_5_15"]}
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as storage:
        for world in args.sizes:
            for mode in args.modes:
                row = run_one(world, args.steps, mode == "checkpoint", args.cpu_per_worker, storage)
                row["load"] = machine_load()
                rows.append(row)
                print(json.dumps(row), flush=True)
    ray.shutdown()
    load["after"] = machine_load()["loadavg_1_5_15"]
    write_results(rows, args, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
