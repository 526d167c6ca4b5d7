"""Regression guard: the benchmark's tutorial job, a few steps, against the recorded medians.

It fails only on a gross regression: more than twice the fixed cost (wall time outside
the training steps) or twice the peak memory of the trainlib variant in the overhead benchmark's
latest result (bench/results/overhead.json, written by bench/bench_overhead.py), or a process left behind. The time
allowance is widened by how slow the machine is right now, the larger of two estimates:
the load (a process on a machine with load L over C cores gets about C/L of a core; the
load average lags, so alone it missed bursts of the suite's own load) and the job's own
training steps against the recorded ones (measured in the same run, under the same load; a
slower step itself is bench_overhead.py's business, not this guard's). It is a guard, not a
benchmark: the figures come from bench/bench_overhead.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from tasks.domain.generated_dataset import write_idx_dataset

# The overhead benchmark's latest medians: its "load_average_before" says how quiet the machine was.
RECORDED = os.path.join(REPO_ROOT, "bench", "results", "overhead.json")
GROSS = 2.0  # fail above this multiple of the recorded median


def _load_factor(*loads: tuple[float, float, float]) -> float:
    """How much slower than on an idle machine a process may run now (>= 1)."""
    return max(1.0, max(load[0] for load in loads) / (os.cpu_count() or 1))


# ~25 s on a quiet machine; minutes under a load of 30+ (the time limits are for hangs, not speed).
@pytest.mark.timeout(1200)
def test_tutorial_job_has_no_gross_overhead_regression(tmp_path):
    with open(RECORDED) as f:
        recorded = json.load(f)["summary"]["trainlib"]
    mirror = tmp_path / "mirror"
    write_idx_dataset(mirror, n_train=1024, n_test=64, seed=3)
    load_before = os.getloadavg()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = REPO_ROOT
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO_ROOT, "bench", "bench_overhead.py"),
            "--variants",
            "trainlib",
            "--steps",
            "6",
            "--warmup-steps",
            "2",
            "--repeats",
            "1",
            "--data",
            str(mirror),
            "--results-dir",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
        env=env,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = json.loads((tmp_path / "results" / "overhead.json").read_text())["runs"]
    factor = max(
        _load_factor(load_before, run["load_average_at_start"], os.getloadavg()),
        recorded["steady_steps_per_s"] / run["steady_steps_per_s"],
    )
    assert run["steps"] == 6 and run["world_size"] == 2
    assert run["leftover_processes"] == []
    # The benchmark's own output, end to end (its units are tests/startup/test_bench_overhead.py).
    assert 0 < run["time_to_first_step_s"] < run["wall_s"] and run["checkpoint_bytes"] > 40 * 2**20
    assert "| trainlib" in (tmp_path / "results" / "overhead.md").read_text()
    allowed_s = GROSS * recorded["outside_steps_s"] * factor
    assert run["outside_steps_s"] <= allowed_s, (
        f"the job's fixed cost (wall time outside the steps) was {run['outside_steps_s']:.1f} s, over "
        f"{GROSS}x the recorded median {recorded['outside_steps_s']:.1f} s x slowness factor {factor:.1f} (steps "
        f"{run['steady_steps_per_s']:.2f}/s, recorded {recorded['steady_steps_per_s']:.2f}/s): "
        f"phases {run['phases_s']}; profile with bench/bench_overhead.py"
    )
    assert run["peak_rss_bytes"] <= GROSS * recorded["peak_rss_bytes"], (
        f"peak RSS of the job's process tree {run['peak_rss_bytes'] / 1e9:.2f} GB is over {GROSS}x the recorded "
        f"median {recorded['peak_rss_bytes'] / 1e9:.2f} GB"
    )
