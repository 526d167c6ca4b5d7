"""The start-up tracer (bench/startup_trace/sitecustomize.py) and how bench/trace_startup.py reads its files."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")


def _load_trace_startup():
    sys.path.insert(0, BENCH)  # it imports its neighbours, as `python bench/trace_startup.py` does
    try:
        spec = importlib.util.spec_from_file_location("trace_startup", os.path.join(BENCH, "trace_startup.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(BENCH)
    return module


def test_the_tracer_records_the_watched_imports_and_calls_of_a_process(tmp_path):
    code = "import ray; print(ray.init.__code__.co_filename.endswith('sitecustomize.py'))"
    env = {**os.environ, "PYTHONPATH": os.path.join(BENCH, "startup_trace"), "TRAINLIB_TRACE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # ray.init is the tracer's timed wrapper
    (log,) = tmp_path.iterdir()
    events = [line.split(" ", 1)[1].strip() for line in log.read_text().splitlines()]
    assert events[0] == "process" and events.index("import ray") < events.index("imported ray")
    # Without TRAINLIB_TRACE_DIR the tracer does nothing.
    env.pop("TRAINLIB_TRACE_DIR")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_phases_are_seconds_from_the_main_process_start_and_a_worker_phase_is_the_slower_rank(tmp_path):
    trace = _load_trace_startup()
    logs = {
        100: [
            (10.0, "process"),
            (11.5, "imported torch"),
            (13.0, "imported torchvision"),
            (13.1, "call ray.init"),
            (14.0, "return ray.init"),
        ],
        200: [
            (13.5, "process"),
            (14.0, "imported ray"),
            (16.0, "imported torch"),
            (16.1, "call TrainWorker.__init__"),
            (18.0, "imported torchvision"),
        ],
        201: [
            (13.6, "process"),
            (14.2, "imported ray"),
            (16.5, "imported torch"),
            (16.6, "call TrainWorker.__init__"),
            (18.4, "imported torchvision"),
        ],
        300: [(13.2, "process")],  # a Python process of Ray's that never imported the job: not a worker
    }
    for pid, rows in logs.items():
        (tmp_path / f"{pid}.log").write_text("".join(f"{t} {text}\n" for t, text in rows))
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank0.json").write_text(json.dumps({"first_step_start": 19.0}))
    phases = trace.phases_of_run("trainlib", str(tmp_path), str(out))
    assert phases["driver: the job's modules imported (torchvision)"] == 3.0
    assert phases["driver: ray.init returned"] == 4.0
    assert phases["workers: Python started"] == 3.6  # the later of the two ranks
    assert phases["workers: torch imported"] == 6.5
    assert phases["workers: torchvision imported"] == 8.4
    assert phases["first step started (rank 0)"] == 9.0
    # torchrun's run has no trainlib phases.
    torchrun = trace.phases_of_run("torchrun", str(tmp_path), str(out))
    assert "driver: ray.init returned" not in torchrun and torchrun["workers: torch imported"] == 6.5
