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
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_overhead import RESULTS

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
BATCH = 128
MALLOC_NAMES = {
    "trainlib": "trainlib's workers' malloc settings",
    "glibc": "glibc's default malloc (as torchrun's ranks)",
}


def _model():
    import torch
    from torchvision.models import resnet18

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def _set_malloc(malloc: str) -> None:
    """``trainlib``: this process allocates as trainlib's workers do (step-sized blocks kept on the heap,
    trainlib/_internal/startup/allocator.py); ``glibc``: glibc's defaults, as torchrun's ranks."""
    if malloc == "trainlib":  # trainlib imports from this checkout: bench_overhead put it on the path
        from trainlib._internal.startup.allocator import keep_step_allocations

        if not keep_step_allocations():
            raise RuntimeError(
                "trainlib's malloc settings were not applied (not glibc, or MALLOC_* set): run with --malloc glibc"
            )


def _threads() -> dict[int, str]:
    """This process's threads: id -> name."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:  # the thread ended meanwhile
            pass
    return names


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of this process's threads: the training (main) thread, gloo's threads, the others."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {"train": 0.0, "gloo": 0.0, "other": 0.0}
    for tid, name in _threads().items():
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        kind = "train" if tid == os.getpid() else "gloo" if "gloo" in name else "other"
        cpu[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return cpu


def _train(model, steps: int, warmup: int, at_warmup: Callable[[], None] | None = None) -> dict[str, float]:
    """Train ``steps`` steps; medians (s) of the steps after ``warmup``: each phase, and CPU per step by thread.
    ``at_warmup`` is called as the first measured step begins (a profiler can start sampling there)."""
    import torch

    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    images, labels = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    last_grad = [0.0]  # when the step's latest gradient was accumulated

    def mark(_param) -> None:
        last_grad[0] = time.perf_counter()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(mark)
    rows: list[tuple[float, ...]] = []
    cpu_start = wall_start = None
    for step in range(steps):
        if step == warmup:
            if at_warmup is not None:
                at_warmup()
            cpu_start, wall_start = _thread_cpu_s(), time.perf_counter()
        t0 = time.perf_counter()
        loss = criterion(model(images), labels)
        t1 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        rows.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2, t2 - last_grad[0]))
    cpu_end, wall = _thread_cpu_s(), time.perf_counter() - wall_start
    kept = rows[warmup:]
    out = {
        name: statistics.median(row[i] for row in kept)
        for i, name in enumerate(("step_s", "forward_s", "backward_s", "optimizer_s", "after_last_grad_s"))
    }
    for kind in cpu_end:
        out[f"cpu_{kind}_s"] = (cpu_end[kind] - cpu_start[kind]) / len(kept)
    out["mean_step_s"] = wall / len(kept)
    return out


def _rank(rank: int, port: int, kwargs: dict, steps: int, warmup: int, out: str, malloc: str) -> None:
    _set_malloc(malloc)
    import psutil
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(_model(), **kwargs)
    phases = _train(model, steps, warmup)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    allreduce = []
    for _ in range(5):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(grads)
        allreduce.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    **phases,
                    "allreduce_s": statistics.median(allreduce),
                    "grad_mb": grads.numel() * 4 / 2**20,
                    "rss_bytes": psutil.Process().memory_info().rss,
                },
                f,
            )
    dist.destroy_process_group()


def _single(steps: int, warmup: int, out: str, malloc: str) -> None:
    _set_malloc(malloc)
    import psutil
    import torch

    torch.set_num_threads(1)
    phases = _train(_model(), steps, warmup)
    with open(out, "w") as f:
        json.dump({**phases, "rss_bytes": psutil.Process().memory_info().rss}, f)


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
    spawn_pair(_rank, kwargs, steps, warmup, out, malloc, what=f" with DDP options {kwargs}")
    with open(out) as f:
        return json.load(f)


def run_single(steps: int, warmup: int, out: str, side_by_side: int = 1, malloc: str = "trainlib") -> dict[str, Any]:
    """One process alone (``side_by_side=1``), or that many at once with no communication: what two
    ranks would reach if the allreduce were free (they still share the caches and memory bandwidth)."""
    import torch.multiprocessing as mp

    outs = [out if i == 0 else f"{out}.{i}" for i in range(side_by_side)]
    procs = [mp.get_context("spawn").Process(target=_single, args=(steps, warmup, o, malloc)) for o in outs]
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
        f"round(s), configurations in rotated order; every process with "
        f"{MALLOC_NAMES[s.get('malloc', 'glibc')]}. Load average before/after: "
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
    pair = report["pair"]
    lines += [
        "",
        'Where a step goes, ms per step (rank 0; the first row: two processes at once, no DDP). "after last '
        "grad\": the part of backward after the last gradient was accumulated, waiting for the last buckets' "
        "allreduce. CPU: the training thread's and gloo's threads'; \"not running\": the training thread's wall "
        "time without CPU (waiting on the other rank, or its core taken by gloo or another process).",
        "",
        "| configuration | step | forward | backward | of it after last grad | optimizer | CPU: training thread "
        "| CPU: gloo threads | training thread not running |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in [("two processes, no DDP", pair), *report["configs"].items()]:
        if "forward_s" not in row:  # written before the phases were measured
            continue
        cells = [
            row["step_s"],
            row["forward_s"],
            row["backward_s"],
            row["after_last_grad_s"],
            row["optimizer_s"],
            row["cpu_train_s"],
            row["cpu_gloo_s"],
            row["mean_step_s"] - row["cpu_train_s"],
        ]
        lines.append(f"| {name} | " + " | ".join(f"{c * 1000:.0f}" for c in cells) + " |")
    if report.get("skipped"):
        lines += [
            "",
            "Not measured (this torch's DistributedDataParallel lacks the option): "
            + ", ".join(report["skipped"])
            + ".",
        ]
    return "\n".join(lines) + "\n"


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
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
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
    with open(os.path.join(args.results_dir, "ddp.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = "# DDP settings on CPU\n\nReproduce: `python bench/bench_ddp.py`.\n\n" + markdown(report)
    with open(os.path.join(args.results_dir, "ddp.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
