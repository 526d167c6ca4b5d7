"""Training functions of tests/core/test_errors.py that run on ``DataParallelTrainer``.

Here, not in the test module: the workers import a training function's module to load it, and
test_errors.py imports torch at top level (its tensor metrics), which costs each worker ~2 s of CPU
on the 2-core CI (the suite's CPU budget). Keep this module free of torch imports.
"""

from __future__ import annotations

import os
import time

import trainlib


def failing_train_func(config):
    rank = trainlib.get_context().get_world_rank()
    with open(os.path.join(config["pid_dir"], f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    trainlib.report({"step": 0})
    if rank == 1:
        # Only once rank 0 runs (report() is no barrier): on a loaded machine its thread may start later.
        rank0_pid = os.path.join(config["pid_dir"], "rank0.pid")
        deadline = time.monotonic() + 120
        while not os.path.exists(rank0_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise_deep_inside(config["message"])
    time.sleep(600)  # rank 0 would wait "forever": the driver must stop it


def raise_deep_inside(message):
    raise ValueError(message)


def reporting_train_func(config):
    trainlib.report({"pid": os.getpid()})


def label_train_func():
    import ray

    trainlib.report({"node": ray.get_runtime_context().get_node_id()})
