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
Every process allocates as trainlib's workers do (``--malloc trainlib``, the default:
trainlib/_internal/startup/allocator.py) or with glibc's defaults, as torchrun's ranks
(``--malloc glibc``). Timings are medians over rounds; the load average is recorded
with them, since this machine is shared.

Where each configuration's step goes, against two processes at once without DDP (rank 0,
ms per step): forward, backward, optimizer; the part of backward after the last gradient
was accumulated (waiting for the last buckets' allreduce); and the CPU per step of the
training thread, of gloo's threads (``gloo_tcp_loop``, ``pt_gloo_runloop``: the allreduce's
copies, sums and socket I/O, on the same cores) and the time the training thread was not
running (waiting on the other rank or preempted by gloo).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

# trainlib from this checkout, in this process and in the spawned ranks (they inherit the path)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddp_ranks import BATCH, ddp_rank, single_process  # noqa: E402
from ddp_report import markdown  # noqa: E402
from results_files import RESULTS, write_results  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "ddp defaults": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "bucket view + bucket_cap_mb=100": {"gradient_as_bucket_view": True, "bucket_cap_mb": 100},
    "bucket view + static_graph": {"gradient_as_bucket_view": True, "static_graph": True},
    # Smaller buckets: less of the allreduce left after the backward pass, more calls.
    "bucket view + bucket_cap_mb=10": {"gradient_as_bucket_view": True, "bucket_cap_mb": 10},
    "bucket view + bucket_cap_mb=4": {"gradient_as_bucket_view": True, "bucket_cap_mb": 4},
    # torch 2.14's: one copy and one division per bucket instead of per parameter (fewer kernel calls).
    "bucket view + batched_grad_copy": {"gradient_as_bucket_view": True, "batched_grad_copy": True},
    # No broadcast of rank 0's BatchNorm buffers before each forward (a second sync point per step).
    "bucket view + no buffer sync in forward": {"gradient_as_bucket_view": True, "forward_sync_buffers": False},
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_pair(target: Callable[..., None], *args: Any, what: str = "") -> None:
    """Run ``target(rank, port, *args)`` in two fresh processes (ranks 0 and 1, a free port for their rendezvous)."""
    import torch.multiprocessing as mp

    port = _free_port()
    procs = [mp.get_context("spawn").Process(target=target, args=(r, port, *args)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank failed (exit code {p.exitcode}){what}")


def run_pair(kwargs: dict, steps: int, warmup: int, out: str, malloc: str = "trainlib") -> dict[str, Any]:
    spawn_pair(ddp_rank, kwargs, steps, warmup, out, malloc, what=f" with DDP options {kwargs}")
    with open(out) as f:
        return json.load(f)


def run_single(steps: int, warmup: int, out: str, side_by_side: int = 1, malloc: str = "trainlib") -> dict[str, Any]:
    """One process alone (``side_by_side=1``), or that many at once with no communication: what two
    ranks would reach if the allreduce were free (they still share the caches and memory bandwidth)."""
    import torch.multiprocessing as mp

    outs = [out if i == 0 else f"{out}.{i}" for i in range(side_by_side)]
    procs = [mp.get_context("spawn").Process(target=single_process, args=(steps, warmup, o, malloc)) for o in outs]
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


def _supported(kwargs: dict[str, Any]) -> bool:
    """Whether this torch's DistributedDataParallel takes every option in ``kwargs`` (some are torch 2.14's)."""
    import inspect

    import torch

    return set(kwargs) <= set(inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--malloc",
        choices=("trainlib", "glibc"),
        default="trainlib",
        help="every process with trainlib's workers' malloc settings, or glibc's defaults (torchrun's)",
    )
    parser.add_argument("--results-dir", default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps={args.steps} must exceed --warmup={args.warmup} by 2 or more")
    os.makedirs(args.results_dir, exist_ok=True)
    tmp = os.path.join(args.results_dir, ".ddp_rank0.json")
    load_before = os.getloadavg()
    names = [name for name in CONFIGS if _supported(CONFIGS[name])]
    skipped = [name for name in CONFIGS if name not in names]
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    singles, pairs = [], []
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(run_pair(CONFIGS[name], args.steps, args.warmup, tmp, args.malloc))
            print(
                f"[round {r + 1}] {name}: {samples[name][-1]['step_s'] * 1000:.0f} ms/step, allreduce "
                f"{samples[name][-1]['allreduce_s'] * 1000:.0f} ms, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        singles.append(run_single(args.steps, args.warmup, tmp, malloc=args.malloc))
        print(f"[round {r + 1}] single process: {singles[-1]['step_s'] * 1000:.0f} ms/step", flush=True)
        pairs.append(run_single(args.steps, args.warmup, tmp, side_by_side=2, malloc=args.malloc))
        print(f"[round {r + 1}] two processes, no DDP: {pairs[-1]['step_s'] * 1000:.0f} ms/step", flush=True)
    os.remove(tmp)

    def med(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {k: statistics.median(row[k] for row in rows) for k in rows[0]}

    report = {
        "settings": {
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "batch": BATCH,
            "malloc": args.malloc,
        },
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "configs": {name: {**med(rows), "kwargs": CONFIGS[name]} for name, rows in samples.items()},
        "single": med(singles),
        "pair": med(pairs),
        "skipped": skipped,
        "raw": {"configs": samples, "single": singles, "pair": pairs},
    }
    header = "# DDP settings on CPU\n\nReproduce: `python bench/bench_ddp.py`.\n"
    write_results(args.results_dir, "ddp", report, [header, markdown(report).rstrip("\n")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
