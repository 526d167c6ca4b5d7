"""Training ranks run at the Ray node's CPU priority, not at Ray's worker niceness.

Ray starts worker processes with niceness 15; niced ranks lose the CPU to everything else on a
busy machine (bench/results/overhead.md measured trainlib at ~0.5x torchrun's steps/s before this).
"""

from __future__ import annotations

import os
import threading

import pytest

import trainlib
from trainlib import DataParallelTrainer


def _can_lower_niceness() -> bool:
    if not hasattr(os, "setpriority"):
        return False
    if os.geteuid() == 0:
        return True
    try:  # CAP_SYS_NICE (bit 23) in the effective capabilities
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) & (1 << 23))
    except (OSError, StopIteration, ValueError):
        return False


def priority_train_func():
    # This (training) thread, a thread it starts, and the raylet that started this worker.
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(child=os.getpriority(os.PRIO_PROCESS, 0)))
    thread.start()
    thread.join()
    trainlib.report(
        {
            "nice_train_thread": os.getpriority(os.PRIO_PROCESS, 0),
            "nice_child_thread": seen["child"],
            "nice_raylet": os.getpriority(os.PRIO_PROCESS, os.getppid()),
        }
    )


@pytest.mark.integration
@pytest.mark.skipif(not _can_lower_niceness(), reason="lowering niceness needs root or CAP_SYS_NICE")
def test_training_threads_run_at_the_nodes_priority(ray_session, storage_path):
    # DataParallelTrainer: workers without torch (the suite's CPU budget); every trainer's worker sets the priority.
    result = DataParallelTrainer(
        priority_train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="priority", storage_path=storage_path),
    ).fit()
    m = result.metrics
    # Ray gives its workers niceness 15 (RAY_worker_niceness) unless configured otherwise.
    assert m["nice_raylet"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert m["nice_train_thread"] == m["nice_raylet"], m
    assert m["nice_child_thread"] == m["nice_raylet"], m
