"""Cost of report() with a ResNet18 checkpoint (~45 MB), to a local folder and to S3 (moto), trainlib vs Ray Train.

    python bench/bench_report.py                      # all variants, 1 repeat
    python bench/bench_report.py --repeats 3 --reports 6 --work-s 1.0

Runs on the machine that calls it; every job is a fresh subprocess with its own
Ray (2 CPUs, 2 workers), so jobs never share a cluster. The S3 endpoint is moto's
server, started here on 127.0.0.1 with fake credentials in the jobs' environment.

The job: each of 2 workers does ``--reports`` rounds of ``--work-s`` seconds of
busy matrix products (the "training"), then calls report(); with checkpoints,
rank 0 first saves the torchvision ResNet18 state_dict (~45 MB) with torch.save
into a temporary folder and reports it. Per job, measured:

* ``report_s``: time inside report() on rank 0 (the training time lost per report
  as the worker sees it; torch.save is timed apart, as ``save_s``);
* ``loop_s``: each worker's loop, first round to last report returned (max over ranks);
* ``fit_s``: fit() on the driver (includes the wait for the last upload to be durable);
* lost per report = (loop or fit time with checkpoints - without) / reports.

The reference floor is ``copy_s``: copying the same checkpoint folder once on the
local disk. Target: trainlib's report() costs about one local copy, local or S3.

Writes ``bench/results/report_cost.json`` and ``bench/results/report_cost.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from report_cost_setup import BUCKET, local_copy_seconds, ray_train_available, start_s3
from report_cost_summary import summarise, table
from results_files import RESULTS, write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the job (runs in the Ray workers) --------------------------------------------------


def _busy(seconds: float) -> None:
    import torch

    a = torch.randn(256, 256)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def train_func(config: dict[str, Any]) -> None:
    import torch
    import torchvision

    if config["framework"] == "trainlib":
        import trainlib as api
        from trainlib import Checkpoint
    else:
        import ray.train as api
        from ray.train import Checkpoint
    rank = api.get_context().get_world_rank()
    state = torchvision.models.resnet18().state_dict()
    report_s, save_s = [], []
    loop_start = time.perf_counter()
    for i in range(config["reports"]):
        _busy(config["work_s"])
        metrics = {"round": i, "loss": 1.0 / (i + 1)}
        if config["checkpoint"] and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                t0 = time.perf_counter()
                torch.save(state, os.path.join(folder, "model.pt"))
                t1 = time.perf_counter()
                api.report(metrics, checkpoint=Checkpoint.from_directory(folder))
                t2 = time.perf_counter()
            save_s.append(t1 - t0)
            report_s.append(t2 - t1)
        else:
            t1 = time.perf_counter()
            api.report(metrics)
            report_s.append(time.perf_counter() - t1)
    loop_s = time.perf_counter() - loop_start
    with open(os.path.join(config["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump({"report_s": report_s, "save_s": save_s, "loop_s": loop_s}, f)


def run_job(framework: str, target: str, checkpoint: bool, reports: int, work_s: float) -> dict[str, Any]:
    """One job in this (fresh) process: start Ray, fit, gather the workers' timings."""
    import ray

    sys.path.insert(0, REPO)
    ray.init(
        address="local",  # its own Ray, never a cluster some `ray start` left on the machine
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.path.join(REPO, "bench")}},
    )
    out_dir = tempfile.mkdtemp(prefix="bench_report_")
    storage_root = tempfile.mkdtemp(prefix="bench_report_runs_")
    name = f"{framework}-{target}-{int(checkpoint)}-{os.getpid()}"
    config = {
        "framework": framework,
        "checkpoint": checkpoint,
        "reports": reports,
        "work_s": work_s,
        "out_dir": out_dir,
    }
    if framework == "trainlib":
        import trainlib
        from trainlib.torch import TorchTrainer

        storage_path = storage_root if target == "local" else f"s3://{BUCKET}/runs"
        trainer = TorchTrainer(
            train_func,
            train_loop_config=config,
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(name=name, storage_path=storage_path, verbose=False),
        )
    else:
        import ray.train
        from ray.train.torch import TorchTrainer as RayTorchTrainer

        kwargs: dict[str, Any] = {"storage_path": storage_root}
        if target == "s3":
            import pyarrow.fs

            endpoint = os.environ["AWS_ENDPOINT_URL"].split("://", 1)[1]
            kwargs = {
                "storage_path": f"{BUCKET}/runs",
                "storage_filesystem": pyarrow.fs.S3FileSystem(
                    access_key=os.environ["AWS_ACCESS_KEY_ID"],
                    secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                    endpoint_override=endpoint,
                    scheme="http",
                    region="us-east-1",
                ),
            }
        trainer = RayTorchTrainer(
            train_func,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=2),
            run_config=ray.train.RunConfig(name=name, **kwargs),
        )
    started = time.perf_counter()
    trainer.fit()
    fit_s = time.perf_counter() - started
    ranks = []
    for rank in range(2):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    ray.shutdown()
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.rmtree(storage_root, ignore_errors=True)
    return {
        "framework": framework,
        "target": target,
        "checkpoint": checkpoint,
        "fit_s": fit_s,
        "loop_s": max(r["loop_s"] for r in ranks),
        "report_s": ranks[0]["report_s"],
        "save_s": ranks[0]["save_s"],
    }


# -- the parent: variants, fresh processes, the result ----------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=5)
    parser.add_argument("--work-s", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--frameworks", default="trainlib,raytrain")
    parser.add_argument("--targets", default="local,s3")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--job", help=argparse.SUPPRESS)  # framework,target,checkpoint: run one job here
    args = parser.parse_args()
    if args.job:
        framework, target, checkpoint = args.job.split(",")
        print("RESULT " + json.dumps(run_job(framework, target, checkpoint == "1", args.reports, args.work_s)))
        return

    frameworks = [f for f in args.frameworks.split(",") if f != "raytrain" or ray_train_available()]
    if "raytrain" in args.frameworks and "raytrain" not in frameworks:
        print("ray[train] is not installed: Ray Train is skipped (pip install 'ray[train]')")
    server, env = start_s3()
    copy_s, size = local_copy_seconds()
    load_before = os.getloadavg()
    runs = []
    variants = [(f, t, c) for f in frameworks for t in args.targets.split(",") for c in (False, True)]
    for repeat in range(args.repeats):
        for framework, target, checkpoint in variants[repeat % len(variants) :] + variants[: repeat % len(variants)]:
            cmd = [
                sys.executable,
                __file__,
                "--job",
                f"{framework},{target},{int(checkpoint)}",
                "--reports",
                str(args.reports),
                "--work-s",
                str(args.work_s),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"job {framework}/{target}/{checkpoint} failed (exit {proc.returncode})")
            run = json.loads(line[len("RESULT ") :])
            run["repeat"] = repeat
            runs.append(run)
            print(
                f"{framework:9s} {target:5s} ckpt={int(checkpoint)} fit {run['fit_s']:.2f}s loop "
                f"{run['loop_s']:.2f}s report median {statistics.median(run['report_s']):.3f}s",
                flush=True,
            )
    server.stop()

    summary = summarise(runs, frameworks, args.targets.split(","), args.reports)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": {"reports": args.reports, "work_s": args.work_s, "repeats": args.repeats, "workers": 2},
        "checkpoint_bytes": size,
        "local_copy_s": copy_s,
        "summary": summary,
        "runs": runs,
    }
    write_results(args.results_dir, "report_cost", result, table(result))


if __name__ == "__main__":
    main()
