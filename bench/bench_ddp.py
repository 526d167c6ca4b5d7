"""DDP settings on CPU/gloo for the tutorial's model: step time, allreduce time, memory. Two local processes.

    python bench/bench_ddp.py                       # writes bench/results/ddp.{json,md}
    python bench/bench_ddp.py --steps 12 --rounds 1 --results-dir /tmp/ddp   # a quick try

What it answers (issue 14): how far 2 DDP ranks are from linear scaling and why.
Each round runs, in fresh process pairs (gloo, 1 thread each, as trainlib's and
torchrun's workers), the tutorial's ResNet18 on random 1x28x28 batches of 128 with
Adam, for every DDP configuration, in a rotated order; then one process alone
(no DDP, 1 thread) for the single-process rate. Per configuration it reports the
median step time, the median time of one allreduce of all gradients (the same
bytes DDP sends per step, timed alone after the steps) and the peak RSS of rank 0.
Timings are medians over rounds; the load average is recorded with them, since
this machine is shared.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "ddp defaults": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "bucket view + bucket_cap_mb=100": {"gradient_as_bucket_view": True, "bucket_cap_mb": 100},
    "bucket view + static_graph": {"gradient_as_bucket_view": True, "static_graph": True},
    # Smaller buckets: less of the allreduce left after the backward pass, more calls.
    "bucket view + bucket_cap_mb=10": {"gradient_as_bucket_view": True, "bucket_cap_mb": 10},
    "bucket view + bucket_cap_mb=4": {"gradient_as_bucket_view": True, "bucket_cap_mb": 4},
}
BATCH = 128


def _model():
    import torch
    from torchvision.models import resnet18

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def _train(model, steps: int, warmup: int) -> list[float]:
    import torch

    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    images, labels = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t)
    return times[warmup:]


def _rank(rank: int, port: int, kwargs: dict, steps: int, warmup: int, out: str) -> None:
    import psutil
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(_model(), **kwargs)
    step_times = _train(model, steps, warmup)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    allreduce = []
    for _ in range(5):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(grads)
        allreduce.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": statistics.median(step_times), "allreduce_s": statistics.median(allreduce),
                       "grad_mb": grads.numel() * 4 / 2**20, "rss_bytes": psutil.Process().memory_info().rss}, f)
    dist.destroy_process_group()


def _single(steps: int, warmup: int, out: str) -> None:
    import psutil
    import torch

    torch.set_num_threads(1)
    step_times = _train(_model(), steps, warmup)
    with open(out, "w") as f:
        json.dump({"step_s": statistics.median(step_times), "rss_bytes": psutil.Process().memory_info().rss}, f)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(kwargs: dict, steps: int, warmup: int, out: str) -> dict[str, Any]:
    import torch.multiprocessing as mp

    port = _free_port()
    procs = [mp.get_context("spawn").Process(target=_rank, args=(r, port, kwargs, steps, warmup, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
        if p.exitcode != 0:
            raise RuntimeError(f"a DDP rank failed (exit code {p.exitcode}) with {kwargs}")
    with open(out) as f:
        return json.load(f)


def run_single(steps: int, warmup: int, out: str, side_by_side: int = 1) -> dict[str, Any]:
    """One process alone (``side_by_side=1``), or that many at once with no communication: what two
    ranks would reach if the allreduce were free (they still share the caches and memory bandwidth)."""
    import torch.multiprocessing as mp

    outs = [out if i == 0 else f"{out}.{i}" for i in range(side_by_side)]
    procs = [mp.get_context("spawn").Process(target=_single, args=(steps, warmup, o)) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    rows = []
    for o in outs:
        with open(o) as f:
            rows.append(json.load(f))
    for o in outs[1:]:
        os.remove(o)
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    single = report["single"]
    lines = [
        f"DDP on CPU/gloo, tutorial ResNet18, batch {BATCH} per rank, 2 ranks x 1 thread on "
        f"{os.cpu_count()} CPUs; {s['steps']} steps (first {s['warmup']} skipped), median of {s['rounds']} "
        f"round(s), configurations in rotated order. Load average before/after: "
        f"{'/'.join(f'{x:.2f}' for x in report['load_average_before'])} / "
        f"{'/'.join(f'{x:.2f}' for x in report['load_average_after'])} (shared machine).",
        "",
        f"One process alone, no DDP: {single['step_s'] * 1000:.0f} ms/step = {BATCH / single['step_s']:.0f} "
        f"samples/s; linear-scaling limit for 2 = {2 * BATCH / single['step_s']:.0f} samples/s.",
        "",
        f"Two such processes at once, no DDP (the limit if the allreduce cost nothing; they still share caches "
        f"and memory bandwidth): {report['pair']['step_s'] * 1000:.0f} ms/step = "
        f"{2 * BATCH / report['pair']['step_s']:.0f} samples/s = "
        f"{single['step_s'] / report['pair']['step_s']:.2f} of the linear limit.",
        "",
        "| DDP configuration | ms/step | samples/s (2 ranks) | of the linear limit | allreduce of all grads, ms "
        "| rank 0 RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["configs"].items():
        lines.append(
            f"| {name} | {row['step_s'] * 1000:.0f} | {2 * BATCH / row['step_s']:.0f} | "
            f"{(2 * BATCH / row['step_s']) / (2 * BATCH / single['step_s']):.2f} | {row['allreduce_s'] * 1000:.0f} "
            f"({row['grad_mb']:.0f} MB) | {row['rss_bytes'] / 2**20:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps={args.steps} must exceed --warmup={args.warmup} by 2 or more")
    os.makedirs(args.results_dir, exist_ok=True)
    tmp = os.path.join(args.results_dir, ".ddp_rank0.json")
    load_before = os.getloadavg()
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    singles, pairs = [], []
    names = list(CONFIGS)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(run_pair(CONFIGS[name], args.steps, args.warmup, tmp))
            print(f"[round {r + 1}] {name}: {samples[name][-1]['step_s'] * 1000:.0f} ms/step, allreduce "
                  f"{samples[name][-1]['allreduce_s'] * 1000:.0f} ms, load {os.getloadavg()[0]:.1f}", flush=True)
        singles.append(run_single(args.steps, args.warmup, tmp))
        print(f"[round {r + 1}] single process: {singles[-1]['step_s'] * 1000:.0f} ms/step", flush=True)
        pairs.append(run_single(args.steps, args.warmup, tmp, side_by_side=2))
        print(f"[round {r + 1}] two processes, no DDP: {pairs[-1]['step_s'] * 1000:.0f} ms/step", flush=True)
    os.remove(tmp)

    def med(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {k: statistics.median(row[k] for row in rows) for k in rows[0]}

    report = {
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "batch": BATCH},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "configs": {name: {**med(rows), "kwargs": CONFIGS[name]} for name, rows in samples.items()},
        "single": med(singles), "pair": med(pairs), "raw": {"configs": samples, "single": singles, "pair": pairs},
    }
    with open(os.path.join(args.results_dir, "ddp.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = "# DDP settings on CPU\n\nReproduce: `python bench/bench_ddp.py`.\n\n" + markdown(report)
    with open(os.path.join(args.results_dir, "ddp.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
