"""How the driver's cost grows with the world size: 2, 8, 16, 32 workers on one local Ray.

    python bench/bench_scaling.py                            # 2 8 16 32 workers, 200 steps
    python bench/bench_scaling.py --sizes 2 8 --steps 20

Runs on the machine that calls it, in one driver process (this one) on an embedded Ray
(``ray.init(address="local")``, ``--cpus`` logical CPUs). Each worker holds
``--cpu-per-worker`` (0.05) CPUs, so 32 workers fit on a 2-core machine; the model is a
4x4 linear layer, each step one update, ``--step-s`` (20 ms) of sleep standing for the rest
of the step's compute, and one ``trainlib.report()``, with and without a
small checkpoint (rank 0's weights, ~1 KB). ``--backend torch`` runs it as TorchTrainer
with DDP (gloo); ``--backend plain`` (default) in NumPy without torch in the workers,
whose ~0.65 GB each a shared 24 GB machine cannot hold 32 times (Ray's memory monitor
kills them); the driver's work per report is the same. Ranks write their wall-clock
marks to a folder (one machine), which the driver reads afterwards. Per world size
and mode, measured on the driver:

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
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from results_files import plain_name  # noqa: E402
from scaling_probes import DriverProbe, PeakRss, machine_load  # noqa: E402
from scaling_report import write_scaling_results  # noqa: E402

import trainlib  # noqa: E402

# -- the job (runs in the Ray workers) ------------------------------------------------------


def _mark(config: dict[str, Any], name: str) -> None:
    """Write this rank's wall-clock time for ``name`` (one machine: the driver reads the folder)."""
    rank = trainlib.get_context().get_world_rank()
    with open(os.path.join(config["marks_dir"], f"{name}.{rank}"), "w") as f:
        f.write(repr(time.time()))


def _steps(config: dict[str, Any], update: Any) -> None:
    """Every step one ``update()`` and one report (rank 0: with a ~1 KB checkpoint if asked)."""
    rank = trainlib.get_context().get_world_rank()
    for step in range(1, config["steps"] + 1):
        if step == 1:
            _mark(config, "first_step")
        state = update()
        time.sleep(config["step_s"])  # the rest of a step's compute: reports arrive spread out, as in training
        _mark(config, f"report_{step}")
        if config["checkpoint"] and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "state.bin"), "wb") as f:
                    f.write(state + bytes(max(0, 1024 - len(state))))
                trainlib.report({"step": step}, checkpoint=trainlib.Checkpoint.from_directory(folder))
        else:
            trainlib.report({"step": step})


# Two functions, not one with a branch: cloudpickle ships a __main__ function with every submodule of
# its global modules that the driver has imported and whose name its code mentions, so a function
# that only names ``torch`` in an untaken branch made each worker import trainlib.torch, and torch
# (~3 s of CPU and ~0.65 GB a process), which the "plain" mode exists to leave out.
def plain_train_func(config: dict[str, Any]) -> None:
    """The update in NumPy on a 4x4 weight; the workers never import the deep-learning framework."""
    import numpy as np

    w, x = np.random.default_rng(trainlib.get_context().get_world_rank()).normal(size=(4, 4)), np.ones((8, 4))

    def update() -> bytes:
        nonlocal w
        w = w - 0.01 * (x.T @ (x @ w)) / 8
        return w.tobytes()

    _steps(config, update)


def torch_train_func(config: dict[str, Any]) -> None:
    """A 4x4 linear layer under DDP (gloo all-reduce of the gradients)."""
    import torch

    from trainlib.torch import prepare_model

    model = prepare_model(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 4)

    def update() -> bytes:
        opt.zero_grad()
        model(x).pow(2).mean().backward()  # DDP all-reduces the gradients
        opt.step()
        return b"".join(p.detach().numpy().tobytes() for p in model.parameters())

    _steps(config, update)


def _marks(folder: str, name: str) -> list[float]:
    import glob

    values = []
    for path in glob.glob(os.path.join(folder, f"{name}.*")):
        with open(path) as f:
            values.append(float(f.read()))
    return values


# -- the driver side ------------------------------------------------------------------------


def run_one(
    world: int, steps: int, checkpoint: bool, cpu_per_worker: float, storage: str, backend: str, step_s: float
) -> dict[str, Any]:
    import psutil

    from trainlib.data_parallel_trainer import DataParallelTrainer
    from trainlib.torch import TorchTrainer

    probe = DriverProbe()
    rss_before = psutil.Process().memory_info().rss
    marks_dir = tempfile.mkdtemp(prefix="marks", dir=storage)
    trainer_cls, train_func = (
        (TorchTrainer, torch_train_func) if backend == "torch" else (DataParallelTrainer, plain_train_func)
    )
    trainer = trainer_cls(
        train_func,
        train_loop_config={"steps": steps, "checkpoint": checkpoint, "marks_dir": marks_dir, "step_s": step_s},
        scaling_config=trainlib.ScalingConfig(
            num_workers=world, resources_per_worker={"CPU": cpu_per_worker}, placement_timeout_s=300
        ),
        run_config=trainlib.RunConfig(
            name=f"scaling-{world}-{'ckpt' if checkpoint else 'metrics'}",
            storage_path=storage,
            callbacks=[probe],
            if_exists="overwrite",
            checkpoint_config=trainlib.CheckpointConfig(num_to_keep=2),
        ),
    )
    with PeakRss() as rss:
        fit_at = time.time()
        result = trainer.fit()
        fit_s = time.time() - fit_at
    if result.error is not None:
        raise RuntimeError(f"{world} workers: {result.error}")
    commits = sorted(probe.commits)
    first = _marks(marks_dir, "first_step")
    assert len(first) == world, f"{len(first)} of {world} ranks marked their first step"
    first_step_s = max(first) - fit_at
    # Steady state: from the first committed report to the last.
    cpu_s = commits[-1][2] - commits[0][2]
    per_step_ms = 1000 * cpu_s / (len(commits) - 1)
    lags = [1000 * (wall - max(_marks(marks_dir, f"report_{step}"))) for step, wall, _, _ in commits]
    wall_per_step_ms = 1000 * (commits[-1][1] - commits[0][1]) / (len(commits) - 1)
    return {
        "world_size": world,
        "backend": backend,
        "checkpoint": checkpoint,
        "steps": steps,
        "fit_s": round(fit_s, 2),
        "first_step_s": round(first_step_s, 2),
        "driver_rss_mb": round(rss.peak / 2**20, 1),
        "driver_rss_growth_mb": round((rss.peak - rss_before) / 2**20, 1),
        "driver_cpu_ms_per_step": round(per_step_ms, 2),
        "driver_cpu_ms_per_step_per_worker": round(per_step_ms / world, 3),
        "wall_ms_per_step": round(wall_per_step_ms, 1),
        "commit_lag_ms_median": round(statistics.median(lags), 1),
        "commit_lag_ms_max": round(max(lags), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=0.02, help="sleep per step in each worker (its compute)")
    parser.add_argument("--cpus", type=float, default=2)
    parser.add_argument(
        "--startup-concurrency",
        type=int,
        default=None,
        help="worker processes Ray may start at once (worker_maximum_startup_concurrency; Ray's "
        "default is one per logical CPU, so 32 workers on 2 CPUs start two at a time)",
    )
    parser.add_argument(
        "--tag", type=plain_name, default="scaling", help="results file name in bench/results (default: %(default)s)"
    )
    parser.add_argument("--cpu-per-worker", type=float, default=0.05)
    parser.add_argument("--modes", nargs="+", default=["metrics", "checkpoint"], choices=["metrics", "checkpoint"])
    parser.add_argument(
        "--backend",
        default="plain",
        choices=["plain", "torch"],
        help="plain: NumPy workers without torch (~1/5 of the memory; the driver's work is the "
        "same); torch: TorchTrainer with DDP",
    )
    args = parser.parse_args()

    import ray

    load = {"before": machine_load()["loadavg_1_5_15"]}
    system_config = (
        {"worker_maximum_startup_concurrency": args.startup_concurrency} if args.startup_concurrency else None
    )
    ray.init(
        address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _system_config=system_config
    )
    rows = []
    with tempfile.TemporaryDirectory() as storage:
        for world in args.sizes:
            for mode in args.modes:
                row = run_one(
                    world, args.steps, mode == "checkpoint", args.cpu_per_worker, storage, args.backend, args.step_s
                )
                row["load"] = machine_load()
                rows.append(row)
                print(json.dumps(row), flush=True)
                write_scaling_results(rows, args, dict(load, after=row["load"]["loadavg_1_5_15"]))  # keep what is done
    ray.shutdown()
    load["after"] = machine_load()["loadavg_1_5_15"]
    write_scaling_results(rows, args, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
