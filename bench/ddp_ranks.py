"""What each process of the DDP benchmark runs (bench_ddp.py spawns them): the tutorial's model, timed steps.

Runs in the spawned rank processes (``ddp_rank``, two of them, gloo) or alone (``single_process``): each trains the
tutorial's ResNet18 on random batches, one torch thread, and writes its medians to a JSON file for the parent.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

BATCH = 128


def tutorial_model():
    import torch
    from torchvision.models import resnet18

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


def set_malloc(malloc: str) -> None:
    """``trainlib``: this process allocates as trainlib's workers do (step-sized blocks kept on the heap,
    trainlib/_internal/startup/allocator.py); ``glibc``: glibc's defaults, as torchrun's ranks."""
    if malloc == "trainlib":  # trainlib imports from this checkout: bench_ddp put it on the path
        from trainlib._internal.startup.allocator import keep_step_allocations

        if not keep_step_allocations():
            raise RuntimeError(
                "trainlib's malloc settings were not applied (not glibc, or MALLOC_* set): run with --malloc glibc"
            )


def thread_names() -> dict[int, str]:
    """This process's threads: id -> name."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:  # the thread ended meanwhile
            pass
    return names


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of this process's threads: the training (main) thread, gloo's threads, the others."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {"train": 0.0, "gloo": 0.0, "other": 0.0}
    for tid, name in thread_names().items():
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        kind = "train" if tid == os.getpid() else "gloo" if "gloo" in name else "other"
        cpu[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return cpu


def train_steps(model, steps: int, warmup: int, at_warmup: Callable[[], None] | None = None) -> dict[str, float]:
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
            cpu_start, wall_start = thread_cpu_s(), time.perf_counter()
        t0 = time.perf_counter()
        loss = criterion(model(images), labels)
        t1 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        rows.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2, t2 - last_grad[0]))
    cpu_end, wall = thread_cpu_s(), time.perf_counter() - wall_start
    kept = rows[warmup:]
    out = {
        name: statistics.median(row[i] for row in kept)
        for i, name in enumerate(("step_s", "forward_s", "backward_s", "optimizer_s", "after_last_grad_s"))
    }
    for kind in cpu_end:
        out[f"cpu_{kind}_s"] = (cpu_end[kind] - cpu_start[kind]) / len(kept)
    out["mean_step_s"] = wall / len(kept)
    return out


def ddp_rank(rank: int, port: int, kwargs: dict, steps: int, warmup: int, out: str, malloc: str) -> None:
    set_malloc(malloc)
    import psutil
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(tutorial_model(), **kwargs)
    phases = train_steps(model, steps, warmup)
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


def single_process(steps: int, warmup: int, out: str, malloc: str) -> None:
    set_malloc(malloc)
    import psutil
    import torch

    torch.set_num_threads(1)
    phases = train_steps(tutorial_model(), steps, warmup)
    with open(out, "w") as f:
        json.dump({**phases, "rss_bytes": psutil.Process().memory_info().rss}, f)
