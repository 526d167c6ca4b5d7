"""The scaling benchmark's result (bench_scaling.py): the rows, the growth per added worker, the tables.

Runs on the driver, after each world size (the rows done so far are kept if a later size fails).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from results_files import RESULTS, write_results


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x; returns (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def write_scaling_results(rows: list[dict], args: argparse.Namespace, load: dict[str, list]) -> None:
    """Write ``bench/results/<--tag>.{json,md}``: the rows so far and each quantity's growth per worker."""
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
    out = {
        "host": platform.node(),
        "python": platform.python_version(),
        "args": vars(args),
        "load_before_after": load,
        "rows": rows,
        "growth": growth,
    }
    lines = [
        "# Driver cost as the world grows (bench/bench_scaling.py)",
        "",
        f"Backend {args.backend}, {args.cpus} logical CPUs for Ray on a {os.cpu_count()}-core machine, "
        f"{args.cpu_per_worker} CPU per worker, {args.steps} steps of {args.step_s * 1000:.0f} ms, report() every step, "
        f"Ray starting at most {args.startup_concurrency or 'its default (one per logical CPU)'} worker processes at "
        "once. Machine load "
        f"(1/5/15-min load average) before: {load['before']}, after: {load['after']}: the machine is shared, "
        "so these are upper bounds.",
        "",
        "| workers | mode | fit() to first step (s) | driver peak RSS (MB) | driver CPU per step (ms) "
        "| per worker (ms) | last report to commit, median / max (ms) | wall per step (ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world_size']} | {'checkpoint' if r['checkpoint'] else 'metrics'} | {r['first_step_s']} "
            f"| {r['driver_rss_mb']} | {r['driver_cpu_ms_per_step']} "
            f"| {r['driver_cpu_ms_per_step_per_worker']} | {r['commit_lag_ms_median']} / "
            f"{r['commit_lag_ms_max']} | {r['wall_ms_per_step']} |"
        )
    lines += [
        "",
        "Growth per added worker (least-squares slope over the world sizes) and linear extrapolation to 512 workers:",
        "",
        "| mode | quantity | per worker | at 512 workers |",
        "|---|---|---:|---:|",
    ]
    for mode, quantities in growth.items():
        for key, g in quantities.items():
            lines.append(f"| {mode} | {key} | {g['per_worker']} | {g['at_512']} |")
    write_results(RESULTS, args.tag, out, lines)
