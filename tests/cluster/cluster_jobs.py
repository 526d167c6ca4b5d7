"""Training functions for the cluster tests. This module exists only on the driver's machine.

The node started without the code cannot import it (nor trainlib, tasks, flows):
trainlib ships these functions by value, and the test's ``runtime_env`` ships trainlib.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time

import trainlib


def node_ips_of_all_ranks() -> list[str]:
    """Every rank's node IP, gathered over the process group (so the group spans those nodes)."""
    import ipaddress

    import ray
    import torch
    import torch.distributed as dist

    mine = torch.tensor([int(ipaddress.ip_address(ray.util.get_node_ip_address()))], dtype=torch.int64)
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [str(ipaddress.ip_address(int(t.item()))) for t in everyone]


HOLD_S = 120.0  # longer than any node loss takes to be noticed, shorter than the tests' timeouts


def spread_train_func(config):
    """Config: steps, sleep_s, hold_at_step. Each step all-reduces, reports and checkpoints (rank 0's state);
    resumable. With ``hold_at_step``, the first attempt's ranks wait after reporting that step (up to
    HOLD_S) for the test to end the attempt, so a slow driver cannot see the attempt finish first.

    The checkpoint's state.json also lists every rank's node IP, in rank order.
    """
    import torch
    import torch.distributed as dist

    ctx = trainlib.get_context()
    rank = ctx.get_world_rank()
    start, total = 0, 0.0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                state = json.load(f)
        start, total = state["step"], state["total"]
    ips = node_ips_of_all_ranks()
    for step in range(start + 1, config["steps"] + 1):
        t = torch.tensor([float(rank + step)])
        dist.all_reduce(t)
        total += float(t.item())
        time.sleep(config.get("sleep_s", 0.0))
        metrics = {
            "step": step,
            "total": total,
            "start_step": start,
            "attempt": ctx.get_attempt(),
            "num_nodes": len(set(ips)),
            # The actor imported torch, and unpickled this function, with the collector paused (bulk_imports.py).
            "collector": [gc.isenabled(), gc.get_freeze_count() > 0],
        }
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"step": step, "total": total, "nodes": ips}, f)
                trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
            else:
                trainlib.report(metrics)
        if step == config.get("hold_at_step") and ctx.get_attempt() == 0:
            time.sleep(HOLD_S)


def expected_total(steps: int, world_size: int) -> float:
    """``total`` after ``steps`` steps of spread_train_func, computed on the driver."""
    return float(sum(sum(rank + step for rank in range(world_size)) for step in range(1, steps + 1)))


def checkpoint_state(checkpoint: trainlib.Checkpoint) -> dict:
    """The state.json of a spread_train_func checkpoint."""
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "state.json")) as f:
            return json.load(f)
