"""The overhead benchmark's harness (bench/bench_overhead.py and its parts): process-tree memory, tables, options."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist")
sys.path.insert(0, os.path.join(REPO, "bench"))  # the benchmark's modules import their neighbours, as its scripts do

import bench_overhead  # noqa: E402
import overhead_jobs  # noqa: E402
import overhead_report  # noqa: E402
import process_tree  # noqa: E402

# A parent that starts a grandchild holding 200 MB, exits without waiting for it (the grandchild
# is re-parented to init), and the grandchild lives on for a while. The grandchild creates the
# file argv[1] once all its pages are touched (under load that takes a while); the parent exits
# some samples after that, so the peak holds both.
_TREE = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(200 * 2**20); "
                  "b[::4096] = b'x' * len(b[::4096]); open(sys.argv[1], 'w').close(); time.sleep(3)", sys.argv[1]])
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
"""


def test_tree_sampler_counts_descendants_even_after_their_parent_exits(tmp_path):
    touched = tmp_path / "touched"
    proc = subprocess.Popen([sys.executable, "-c", _TREE, str(touched)])
    sampler = process_tree.TreeSampler(proc.pid, 0.1)
    sampler.start()
    proc.wait()
    time.sleep(0.5)  # the grandchild outlives its parent: still sampled
    sampler.stop()
    assert sampler.peak_bytes >= 200 * 2**20
    assert sampler.peak_processes == 2
    leftovers = sampler.leftovers(grace_s=0.0)
    assert len(leftovers) == 1 and "bytearray" in sampler.names[leftovers[0].pid]
    leftovers[0].kill()
    assert sampler.cpu_by_label()  # CPU seconds were recorded per kind of process


def test_process_label_names_scripts_and_modules():
    me = psutil.Process()
    assert process_tree.process_label(me) is not None
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--help"], stdout=subprocess.DEVNULL)
    try:
        label = process_tree.process_label(psutil.Process(proc.pid))
        assert label in ("http.server", None)  # None only if it already exited
    finally:
        proc.wait()


def _run(variant, wall, steps_per_s, outside=5.0):
    return {
        "variant": variant,
        "returncode": 0,
        "framework": variant,
        "wall_s": wall,
        "time_to_first_step_s": 1.0,
        "steady_steps_per_s": steps_per_s,
        "outside_steps_s": outside,
        "peak_rss_bytes": 1e9,
        "world_size": 2,
        "threads": {},
        "phases_s": {"imports_done": 1.0},
    }


def test_medians_and_target_ratios():
    runs = [_run("trainlib", w, s) for w, s in [(30, 2.0), (34, 1.9), (90, 0.5)]]
    runs += [_run("raytrain", w, 1.5) for w in (50, 60, 55)]
    runs += [_run("torchrun", 20, s) for s in (2.0, 1.9, 2.1)]
    runs.append({"variant": "torchrun", "returncode": 1, "error": "boom"})
    summary = overhead_report.summarise(runs, ["trainlib", "raytrain", "torchrun"])
    assert (
        overhead_report.ratios(summary)["launch_wall_over_raytrain_wall"]["value"] is None
    )  # no launcher runs: no ratio
    runs += [_run("trainlib_launch", w, 2.0) for w in (25, 27, 26)]
    summary = overhead_report.summarise(runs, ["trainlib", "trainlib_launch", "raytrain", "torchrun"])
    assert summary["trainlib"]["wall_s"] == 34 and summary["raytrain"]["wall_s"] == 55
    assert summary["torchrun"]["runs_failed"] == 1 and summary["torchrun"]["runs_ok"] == 3
    r = overhead_report.ratios(summary)
    assert r["trainlib_wall_over_raytrain_wall"]["value"] == pytest.approx(34 / 55)
    assert r["trainlib_wall_over_raytrain_wall"]["met"] is False
    assert r["trainlib_steps_per_s_over_torchrun"]["value"] == pytest.approx(1.9 / 2.0)
    assert r["trainlib_steps_per_s_over_torchrun"]["met"] is False
    assert r["launch_wall_over_raytrain_wall"]["value"] == pytest.approx(26 / 55)
    assert r["launch_wall_over_raytrain_wall"]["met"] is True


def test_bad_options_name_the_option(capsys):
    with pytest.raises(SystemExit):
        bench_overhead.parse_args(["--variants", "trainlib,deepspeed"])
    assert "deepspeed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_overhead.parse_args(["--steps", "5", "--warmup-steps", "5"])
    assert "--warmup-steps" in capsys.readouterr().err


def test_the_defaults_parse_to_the_targets_variants():
    """`make bench` runs the script with no options: trainlib_base needs --baseline, so it is not a default."""
    assert bench_overhead.parse_args(["--data", DATA]).variants == [
        "trainlib",
        "trainlib_launch",
        "raytrain",
        "torchrun",
        "plain",
    ]
    with_base = bench_overhead.parse_args(["--data", DATA, "--baseline", REPO])
    assert with_base.variants == ["trainlib", "trainlib_launch", "raytrain", "torchrun", "plain", "trainlib_base"]
    # The launcher's variant runs the very job script of the trainlib variant, through `python -m trainlib`.
    launch, plain = (overhead_jobs.command(v, 40, "DATA", "STORE", "OUT") for v in ("trainlib_launch", "trainlib"))
    assert launch[1:3] == ["-m", "trainlib"] and launch[3:] == plain[1:]
