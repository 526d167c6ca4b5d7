"""glibc malloc settings and the training step: page faults, kernel time, step time, memory. Two local DDP ranks.

    python bench/bench_malloc.py                    # writes bench/results/malloc.{json,md}
    python bench/bench_malloc.py --rounds 1 --results-dir /tmp/m   # a quick try

What it answers (issue 14, trainlib/_internal/startup/allocator.py): how much of a CPU training step
goes to faulting in memory that glibc handed back to the kernel after the previous step, and what
trainlib's worker settings change. Each round runs, in fresh process pairs (gloo, 1 thread each,
the tutorial's ResNet18 on FashionMNIST through a DataLoader with its transforms, batches of 128),
three configurations in a rotated order:

- ``main thread, glibc defaults``: as a torchrun rank trains;
- ``training thread, glibc defaults``: as trainlib's workers trained before the change (the
  training function runs in a thread of the Ray actor);
- ``training thread, trainlib's settings``: ``keep_step_allocations()``, as a TorchTrainer worker now.

Per configuration and rank: the median step time over steps 6-40, minor page faults and kernel
(system) CPU time per step, and the process's resident memory after the steps.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time
from typing import Any

from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench", "jobs"))

CONFIGS = ("main thread, glibc defaults", "training thread, glibc defaults", "training thread, trainlib's settings")
STEPS, WARMUP = 40, 5


def _train(data_root: str, out: dict[str, Any]) -> None:
    import torch
    from common import BATCH_SIZE, LEARNING_RATE, build_dataset, build_model
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model(), gradient_as_bucket_view=True)
    dataset = build_dataset(data_root)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset, shuffle=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    criterion = torch.nn.CrossEntropyLoss()
    times = []
    for i, (images, labels) in enumerate(loader):
        if i == WARMUP:
            usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        if i + 1 == STEPS:
            break
    end = resource.getrusage(resource.RUSAGE_SELF)
    measured = STEPS - WARMUP
    out.update(
        step_ms=1000 * statistics.median(times[WARMUP:]),
        faults_per_step=(end.ru_minflt - usage.ru_minflt) / measured,
        kernel_ms_per_step=1000 * (end.ru_stime - usage.ru_stime) / measured,
        rss_mb=int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6,
    )


def _rank(rank: int, port: int, config: str, data_root: str, results: Any) -> None:
    import torch
    import torch.distributed as dist

    from trainlib._internal.startup.allocator import keep_step_allocations

    torch.set_num_threads(1)
    applied = keep_step_allocations() if config == CONFIGS[2] else False
    dist.init_process_group(
        "gloo", store=dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0), rank=rank, world_size=2
    )
    out: dict[str, Any] = {}
    if config == CONFIGS[0]:
        _train(data_root, out)
    else:
        thread = threading.Thread(target=_train, args=(data_root, out))
        thread.start()
        thread.join()
    dist.destroy_process_group()
    results.put({"config": config, "rank": rank, "settings_applied": applied, **out})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()

    import tempfile

    import torch.multiprocessing as mp

    from tasks.domain.torchvision_layout import torchvision_layout

    data_root = tempfile.mkdtemp(prefix="bench_malloc_")
    torchvision_layout(args.data, data_root)
    context = mp.get_context("spawn")
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    port = 29900 + os.getpid() % 1000
    for round_index in range(args.rounds):
        order = CONFIGS[round_index % 3 :] + CONFIGS[: round_index % 3]
        for config in order:
            port += 1
            results = context.Queue()
            ranks = [context.Process(target=_rank, args=(r, port, config, data_root, results)) for r in range(2)]
            for p in ranks:
                p.start()
            runs += [{**results.get(timeout=600), "round": round_index} for _ in ranks]
            for p in ranks:
                p.join()
    summary = {
        config: {
            key: statistics.median(r[key] for r in runs if r["config"] == config)
            for key in ("step_ms", "faults_per_step", "kernel_ms_per_step", "rss_mb")
        }
        for config in CONFIGS
    }
    payload = {
        "command": " ".join(["python", "bench/bench_malloc.py", *sys.argv[1:]]),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "steps": STEPS,
        "warmup": WARMUP,
        "summary": summary,
        "runs": runs,
    }
    lines = [
        "# glibc malloc and the training step",
        "",
        f"`{payload['command']}`: 2 DDP ranks (gloo, 1 thread each) on 2 CPUs, the "
        f"tutorial's ResNet18 on FashionMNIST, batches of 128; medians over {args.rounds} round(s) x 2 ranks of "
        f"steps {WARMUP + 1}-{STEPS}. Load average before {load_before[0]:.2f}, after {payload['load_average_after'][0]:.2f}.",
        "",
        "| configuration | step ms | page faults / step | kernel ms / step | RSS after, MB |",
        "|---|---|---|---|---|",
    ]
    for config, s in summary.items():
        lines.append(
            f"| {config} | {s['step_ms']:.0f} | {s['faults_per_step']:.0f} | {s['kernel_ms_per_step']:.0f} | "
            f"{s['rss_mb']:.0f} |"
        )
    write_results(args.results_dir, "malloc", payload, lines)


if __name__ == "__main__":
    main()
