"""The benchmarks' one entry point: ``python -m bench`` lists them, ``python -m bench NAME [ARGS...]`` runs one.

Runs on the machine that calls it, in this process (each script starts its own fresh processes). ``ARGS`` go to
the script after the preset's own arguments (a later option wins: ``python -m bench overhead --repeats 1``);
``python -m bench NAME --help`` shows the script's options. Every benchmark writes bench/results/NAME.{json,md} (parity adds its section to data's).
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One named benchmark: the script in bench/ that runs it and the arguments that make it this one."""

    script: str
    args: tuple[str, ...]
    what: str


BENCHMARKS: dict[str, Benchmark] = {
    "overhead": Benchmark(
        "bench_overhead.py", (), "tutorial job, 40 steps, 2 workers: trainlib vs Ray Train, torchrun, plain PyTorch"
    ),
    "overhead_400": Benchmark(
        "bench_overhead.py",
        ("--steps", "400", "--repeats", "2", "--variants", "trainlib,torchrun,plain", "--name", "overhead_400"),
        "the same job, 400 steps: samples/s against linear scaling (2 x one single-thread process)",
    ),
    "local_mode": Benchmark(
        "bench_overhead.py",
        ("--variants", "trainlib_local,raytrain_local,plain", "--name", "local_mode"),
        "local mode (num_workers=0) vs Ray Train's local mode and plain PyTorch, one process",
    ),
    "startup_trace": Benchmark(
        "trace_startup.py", (), "where the seconds before the first step go, process by process"
    ),
    "ddp": Benchmark("bench_ddp.py", (), "DDP settings on CPU/gloo: step time, allreduce time, a step's phases"),
    "malloc": Benchmark("bench_malloc.py", (), "glibc malloc settings and the training step: page faults, step time"),
    "bulk_imports": Benchmark(
        "bench_bulk_imports.py", (), "a worker's imports with the cyclic collector on and paused"
    ),
    "rendezvous": Benchmark("bench_rendezvous.py", (), "forming the process group when a rank is ready early"),
    "report_cost": Benchmark(
        "bench_report.py", (), "report() with a 47 MB checkpoint, local and S3: trainlib vs Ray Train"
    ),
    "ray_data": Benchmark(
        "bench_ray_data.py", (), "Ray Data vs DataLoader on the tutorial job, trainlib and Ray Train"
    ),
    "parity": Benchmark(
        "bench_parity.py",
        (),
        "folder source vs idx files, same recipe: test accuracy (into data.json/.md, beside data's figures)",
    ),
    "scaling": Benchmark("bench_scaling.py", (), "the driver's cost per step and to the first step, 2 to 32 workers"),
    "pipeline": Benchmark(
        "bench_pipeline.py", ("--epochs", "1", "--epochs", "1"), "the pipeline, 1 epoch, twice in one home: overhead"
    ),
    "pipeline_10ep": Benchmark(
        "bench_pipeline.py", ("--epochs", "10", "--tag", "pipeline_10ep"), "the pipeline, 10 epochs: test accuracy"
    ),
    "pipeline_trace": Benchmark("trace_pipeline.py", (), "where a pipeline run's seconds beyond fit() go"),
    "network": Benchmark(
        "bench_network.py", (), "each network's training step, scoring 10,000 images, a 64-image call"
    ),
    "recipe": Benchmark("bench_recipe.py", (), "the recipes on a subset of FashionMNIST: test accuracy"),
    "model": Benchmark("bench_model.py", (), "the registered model: pyfunc images/s, batch scoring, served latency"),
    "gpu": Benchmark("gpu_check.py", (), "on a CUDA machine: tests/gpu, then local mode vs plain PyTorch steps/s"),
    "data": Benchmark(
        "bench_data.py", (), "a 70,000-PNG folder source: listing and hashing, decoding against ImageFolder"
    ),
    "weekly": Benchmark(
        "bench_weekly.py", (), "the continuous-training walk-through: a base set, five weekly batches, a quiet week"
    ),
    "frameworks": Benchmark(
        "bench_frameworks.py", (), "Ray Train's Lightning and Transformers examples on trainlib and on Ray Train"
    ),
}


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    rows = [f"  {name:<{width}}  {b.what}" for name, b in BENCHMARKS.items()]
    return "usage: python -m bench NAME [ARGS...]   (writes bench/results/NAME.{json,md})\n\n" + "\n".join(rows)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(usage())
        return 0
    name, extra = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; choose one of:\n{usage()}", file=sys.stderr)
        return 2
    bench = BENCHMARKS[name]
    script = os.path.join(HERE, bench.script)
    sys.argv = [script, *bench.args, *extra]
    sys.path.insert(0, HERE)  # the scripts import their neighbours, as `python bench/SCRIPT.py` lets them
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
