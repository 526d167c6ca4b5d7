"""The report-cost benchmark's figures (bench_report.py): medians per framework and storage, and the table.

Runs in the benchmark's parent process, on the timings its jobs returned.
"""

from __future__ import annotations

import statistics
from typing import Any


def summarise(runs: list[dict[str, Any]], frameworks: list[str], targets: list[str], reports: int) -> list[dict]:
    """Per framework and storage: time in report(), torch.save, and the training and job time lost per report."""
    summary = []
    for framework in frameworks:
        for target in targets:
            with_c = [r for r in runs if (r["framework"], r["target"], r["checkpoint"]) == (framework, target, True)]
            without = [r for r in runs if (r["framework"], r["target"], r["checkpoint"]) == (framework, target, False)]
            med = lambda rs, key: statistics.median(r[key] for r in rs)  # noqa: E731
            reports_with = [x for r in with_c for x in r["report_s"]]
            summary.append(
                {
                    "framework": framework,
                    "target": target,
                    "report_s_median": statistics.median(reports_with),
                    "report_s_max": max(reports_with),
                    "save_s_median": statistics.median(x for r in with_c for x in r["save_s"]),
                    "loop_lost_per_report_s": (med(with_c, "loop_s") - med(without, "loop_s")) / reports,
                    "fit_lost_per_report_s": (med(with_c, "fit_s") - med(without, "fit_s")) / reports,
                    "fit_s_with": med(with_c, "fit_s"),
                    "fit_s_without": med(without, "fit_s"),
                }
            )
    return summary


def table(result: dict[str, Any]) -> list[str]:
    """The result's Markdown lines: the settings and the load, then one row per framework and storage."""
    settings, before, after = result["settings"], result["load_average_before"], result["load_average_after"]
    lines = [
        f"# Cost of report() with a ResNet18 checkpoint ({result['checkpoint_bytes'] / 1e6:.1f} MB)",
        "",
        f"{result['machine']['cpus']} CPUs, {settings['workers']} workers, {settings['reports']} reports of "
        f"{settings['work_s']:.1f} s of work each, {settings['repeats']} repeat(s); load average before "
        f"{before[0]:.1f}, after {after[0]:.1f} (a shared machine: expect noise). One local copy of the "
        f"checkpoint folder takes {result['local_copy_s']:.3f} s (the floor).",
        "",
        "| framework | storage | time in report() (median / max) | torch.save | training lost per report (loop, incl. torch.save) "
        "| job time lost per report (fit) | fit with / without checkpoints |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['framework']} | {s['target']} | {s['report_s_median']:.3f} s / {s['report_s_max']:.3f} s "
            f"| {s['save_s_median']:.3f} s | {s['loop_lost_per_report_s']:.3f} s "
            f"| {s['fit_lost_per_report_s']:.3f} s | {s['fit_s_with']:.1f} s / {s['fit_s_without']:.1f} s |"
        )
    return lines
