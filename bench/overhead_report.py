"""The overhead benchmark's figures: medians per variant, the issue's targets, the tables, the result files.

Runs in the benchmark's process (bench_overhead.py), after the runs or on a saved result (``--rebuild``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import psutil
from overhead_jobs import REPO, VARIANTS
from results_files import write_results

# Issue 14's targets, on the 40-step tutorial job with 2 workers.
TARGET_WALL_RATIO = 0.5  # trainlib wall / Ray Train wall, at most
TARGET_THROUGHPUT_RATIO = 1.0  # trainlib steady steps/s / torchrun's, at least
TARGET_FIRST_STEP_EXTRA_S = 3.0  # trainlib time to first step - torchrun's, at most
TARGET_RSS_RATIO = 1.2  # trainlib peak RSS of the process tree / torchrun's, at most


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    summary = {}
    for v in variants:
        ok = [r for r in runs if r["variant"] == v and r["returncode"] == 0 and "error" not in r]
        phases = {}
        if ok:
            for key in ok[0]["phases_s"]:
                phases[key] = statistics.median(r["phases_s"][key] for r in ok if key in r["phases_s"])
        summary[v] = {
            "label": VARIANTS[v],
            "framework": ok[0]["framework"] if ok else None,
            "runs_ok": len(ok),
            "runs_failed": sum(1 for r in runs if r["variant"] == v) - len(ok),
            "wall_s": median_of(ok, "wall_s"),
            "time_to_first_step_s": median_of(ok, "time_to_first_step_s"),
            "steady_steps_per_s": median_of(ok, "steady_steps_per_s"),
            "outside_steps_s": median_of(ok, "outside_steps_s"),
            "cpu_s_training": median_of(ok, "cpu_s_training"),
            "cpu_s_other": median_of(ok, "cpu_s_other"),
            "steady_cpu_share_other": median_of(ok, "steady_cpu_share_other"),
            "peak_rss_bytes": median_of(ok, "peak_rss_bytes"),
            "phases_s": phases,
            "world_size": ok[0]["world_size"] if ok else None,
            "threads": ok[0]["threads"] if ok else None,
        }
    return summary


def ratios(summary: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: str, b: str, key: str) -> float | None:
        if a in summary and b in summary and summary[a][key] and summary[b][key]:
            return summary[a][key] / summary[b][key]
        return None

    def target(value: float | None, text: str, met: Callable[[float], bool]) -> dict[str, Any]:
        return {"value": value, "target": text, "met": None if value is None else met(value)}

    def targets(variant: str, prefix: str) -> dict[str, Any]:
        first_extra = None
        first, torchrun_first = (summary.get(v, {}).get("time_to_first_step_s") for v in (variant, "torchrun"))
        if first and torchrun_first:
            first_extra = first - torchrun_first
        return {
            f"{prefix}_wall_over_raytrain_wall": target(
                ratio(variant, "raytrain", "wall_s"), f"<= {TARGET_WALL_RATIO}", lambda v: v <= TARGET_WALL_RATIO
            ),
            f"{prefix}_first_step_minus_torchrun_s": target(
                first_extra, f"<= +{TARGET_FIRST_STEP_EXTRA_S:g} s", lambda v: v <= TARGET_FIRST_STEP_EXTRA_S
            ),
            f"{prefix}_steps_per_s_over_torchrun": target(
                ratio(variant, "torchrun", "steady_steps_per_s"),
                f">= {TARGET_THROUGHPUT_RATIO}",
                lambda v: v >= TARGET_THROUGHPUT_RATIO,
            ),
            f"{prefix}_peak_rss_over_torchrun": target(
                ratio(variant, "torchrun", "peak_rss_bytes"), f"<= {TARGET_RSS_RATIO}", lambda v: v <= TARGET_RSS_RATIO
            ),
        }

    return {
        **targets("trainlib", "trainlib"),
        # The same script run by `python -m trainlib` (Ray and its workers' imports started before the script's).
        **targets("trainlib_launch", "launch"),
        "trainlib_time_to_first_step_over_raytrain": ratio("trainlib", "raytrain", "time_to_first_step_s"),
        "trainlib_outside_steps_over_raytrain": ratio("trainlib", "raytrain", "outside_steps_s"),
        "trainlib_peak_rss_over_raytrain": ratio("trainlib", "raytrain", "peak_rss_bytes"),
        # This checkout against --baseline's, on the same job in the same run.
        "trainlib_wall_over_baseline": ratio("trainlib", "trainlib_base", "wall_s"),
        "trainlib_outside_steps_over_baseline": ratio("trainlib", "trainlib_base", "outside_steps_s"),
        "trainlib_peak_rss_over_baseline": ratio("trainlib", "trainlib_base", "peak_rss_bytes"),
    }


def machine_info() -> dict[str, Any]:
    import ray
    import torch
    import torchvision

    return {
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "ray": ray.__version__,
        # ray.init() without an address joins a cluster started by `ray start` if this file exists.
        "ray_current_cluster_file_present": os.path.exists(
            os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
        ),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty_files": len(_git("status", "--porcelain").splitlines()),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    s, r, settings = report["summary"], report["ratios"], report["settings"]
    lines = [
        f"Tutorial job (ResNet18, FashionMNIST, batch 128 per worker), {settings['steps']} steps per worker, "
        f"median of {settings['repeats']} fresh-process runs per variant; steady state skips the first "
        f"{settings['warmup_steps']} steps. {report['machine']['logical_cpus']} CPUs, torch "
        f"{report['machine']['torch']}, ray {report['machine']['ray']}.",
        "",
        "| variant | workers | wall s | time to first step s | steady steps/s | samples/s | wall outside steps s "
        "| peak RSS (tree) GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, row in s.items():
        samples = None if row["steady_steps_per_s"] is None else row["steady_steps_per_s"] * 128 * row["world_size"]
        name = row["framework"] or row["label"]
        if sum(1 for other in s.values() if other["framework"] == row["framework"]) > 1:
            name = f"{name} ({v})"  # the same framework run two ways (trainlib_launch, trainlib_base)
        failed = f" ({row['runs_failed']} failed)" if row["runs_failed"] else ""
        lines.append(
            f"| {name}{failed} | {row['world_size'] or 'n/a'} | {_fmt(row['wall_s'], '.1f')} | "
            f"{_fmt(row['time_to_first_step_s'], '.1f')} | {_fmt(row['steady_steps_per_s'], '.2f')} | "
            f"{_fmt(samples, '.0f')} | {_fmt(row['outside_steps_s'], '.1f')} | {_fmt(None if row['peak_rss_bytes'] is None else row['peak_rss_bytes'] / 1e9, '.2f')} |"
        )

    def verdict(x: dict[str, Any]) -> str:
        return "n/a" if x["met"] is None else ("met" if x["met"] else "MISSED")

    lines += ["", "| target (issue 14) | measured | target | |", "|---|---|---|---|"]
    rows = [
        ("wall_over_raytrain_wall", "wall / Ray Train wall", ".2f"),
        ("first_step_minus_torchrun_s", "time to first step - torchrun's, s", "+.1f"),
        ("steps_per_s_over_torchrun", "steady steps/s / torchrun's", ".3f"),
        ("peak_rss_over_torchrun", "peak RSS / torchrun's", ".2f"),
    ]
    ways = [("trainlib", "trainlib")] + ([("launch", "`python -m trainlib`:")] if "trainlib_launch" in s else [])
    for prefix, who in ways:
        for key, label, spec in rows:
            x = r[f"{prefix}_{key}"]
            lines.append(f"| {who} {label} | {_fmt(x['value'], spec)} | {x['target']} | {verdict(x)} |")
    lines.append(
        f"| trainlib / Ray Train, wall outside the steps | "
        f"{_fmt(r['trainlib_outside_steps_over_raytrain'], '.2f')} | (no target) | |"
    )
    if r.get("trainlib_wall_over_baseline") is not None:
        lines.append(
            f"| trainlib / trainlib before (--baseline): wall, outside the steps, peak RSS | "
            f"{_fmt(r['trainlib_wall_over_baseline'], '.2f')}, "
            f"{_fmt(r['trainlib_outside_steps_over_baseline'], '.2f')}, "
            f"{_fmt(r['trainlib_peak_rss_over_baseline'], '.2f')} | (no target) | |"
        )
    lines += [
        "",
        "Where the wall time goes (median seconds from process start):",
        "",
        "| variant | imports done | train_func entered | first step | last step | checkpoint report | last step to exit "
        "| CPU s: training processes / others | others' CPU share in steady state |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, row in s.items():
        p = row["phases_s"]
        if not p:
            continue
        lines.append(
            f"| {v} | {p['imports_done']:.1f} | {p['train_func_enter']:.1f} | {p['first_step_start']:.1f} | "
            f"{p['last_step_end']:.1f} | {p['report_s']:.2f} | {p['after_last_step_to_exit']:.1f} | "
            f"{_fmt(row.get('cpu_s_training'), '.0f')} / {_fmt(row.get('cpu_s_other'), '.0f')} | "
            f"{_fmt(None if row.get('steady_cpu_share_other') is None else 100 * row['steady_cpu_share_other'], '.1f')}% |"
        )
    lb, la = report["load_average_before"], report["load_average_after"]
    lines += [
        "",
        f"Load average (1/5/15 min) before: {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}, after: "
        f"{la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}. Peak RSS sums every process of the job's tree (for Ray: driver, "
        "GCS, raylet, agents, workers), so shared library pages count once per process.",
    ]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], results_dir: str, name: str = "overhead") -> str:
    """Write ``<results_dir>/<name>.{json,md}`` (the latest run only) and return the tables."""
    table = markdown(report)
    header = (
        "# Overhead benchmark\n\nReproduce: `python -m bench overhead` (= `python bench/bench_overhead.py`); this file "
        f"was written by `{report['command']}`.\n"
    )
    write_results(results_dir, name, report, [header, table.rstrip("\n")])
    return table


def rebuild(path: str, results_dir: str, name: str = "overhead") -> int:
    """Recompute the summary of a saved report (e.g. after changing the tables), from its raw runs."""
    with open(path) as f:
        report = json.load(f)
    report.pop("created", None)  # a result holds figures and conditions, not when it was made: git has that
    for run in report["runs"]:
        run.pop("start", None)
        if "error" not in run and "outside_steps_s" not in run:
            p = run["phases_s"]
            run["outside_steps_s"] = run["wall_s"] - (p["last_step_end"] - p["first_step_start"])
        # Runs recorded before process_label kept the last readable name: a process sampled while
        # exiting got the fallback label "python", so its CPU split is unknown. Leave it out.
        if "python" in run.get("cpu_s_by_process", {}):
            run["cpu_split_unknown"] = True
            run["cpu_s_training"] = run["cpu_s_other"] = run["steady_cpu_share_other"] = None
    report["summary"] = summarise(report["runs"], report["settings"]["variants"])
    report["ratios"] = ratios(report["summary"])
    write_report(report, results_dir, name)
    return 0
