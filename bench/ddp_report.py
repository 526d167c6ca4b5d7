"""The DDP benchmark's tables (bench_ddp.py): step times against the linear limit, and a step's phases.

Runs in the benchmark's parent process, on the medians it gathered from the ranks.
"""

from __future__ import annotations

import os
from typing import Any

from ddp_ranks import BATCH

MALLOC_NAMES = {
    "trainlib": "trainlib's workers' malloc settings",
    "glibc": "glibc's default malloc (as torchrun's ranks)",
}


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
