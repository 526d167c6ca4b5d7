"""Training functions shared by the storage and fault-tolerance tests (shipped to Ray workers by value).

``resumable_train_func`` is deterministic: each epoch all-reduces a tensor and folds
it into the state, so a run that is killed and resumed from its latest checkpoint
ends with exactly the same metrics as one that never failed, and a run that
silently restarted from epoch 1 (or skipped epochs) ends with different ones.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import trainlib


def _wait_for_commit(run_path: str, epoch: int, timeout: float = 60.0) -> None:
    """Wait until the driver committed ``checkpoint_<epoch>`` (local or s3 run folder)."""
    import fsspec

    fs, inner = fsspec.core.url_to_fs(run_path)
    marker = f"{inner.rstrip('/')}/checkpoint_{epoch:06d}/.trainlib_commit.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fs.invalidate_cache()
        if fs.exists(marker):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{marker} was not committed within {timeout}s")


def resumable_train_func(config):
    """Config: epochs, ckpt_every, fail (None|'kill'|'raise'), fail_epoch, fail_rank, payload_bytes,
    sleep_s (per epoch), fail_on_attempts (attempts on which to fail, default [0])."""
    import torch
    import torch.distributed as dist

    ctx = trainlib.get_context()
    rank = ctx.get_world_rank()
    if config.get("node_dir"):  # where each rank of each attempt runs, for the node-loss test
        import ray

        with open(os.path.join(config["node_dir"], f"attempt{ctx.get_attempt()}_rank{rank}"), "w") as f:
            f.write(ray.get_runtime_context().get_node_id())
    start, w = 1, torch.zeros(4, dtype=torch.float64)
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        start, w = state["epoch"] + 1, state["w"]
    for epoch in range(start, config["epochs"] + 1):
        g = torch.full((4,), float(rank + epoch), dtype=torch.float64)
        if ctx.get_world_size() > 1:
            dist.all_reduce(g)
        w = w * 0.5 + g
        if (
            config.get("fail")
            and epoch == config["fail_epoch"]
            and rank == config.get("fail_rank", 1)
            and ctx.get_attempt() in config.get("fail_on_attempts", [0])
        ):
            # Fail after the previous checkpoint is committed, so "resume from the latest" is exact.
            _wait_for_commit(ctx.get_run_path(), epoch - 1 - (epoch - 1) % config["ckpt_every"])
            if config["fail"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"injected failure at epoch {epoch} on rank {rank}")
        metrics = {"epoch": epoch, "w": float(w.sum()), "start_epoch": start, "world_size": ctx.get_world_size()}
        if config.get("sleep_s"):
            time.sleep(config["sleep_s"])
        if epoch % config["ckpt_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save({"epoch": epoch, "w": w}, os.path.join(folder, "state.pt"))
                    if config.get("payload_bytes"):
                        with open(os.path.join(folder, "payload.bin"), "wb") as f:
                            f.write(os.urandom(config["payload_bytes"]))
                    trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
                else:
                    trainlib.report(metrics)
        else:
            trainlib.report(metrics)


def hung_collective_train_func(config):
    """Rank 1 skips the all_reduce that rank 0 waits in."""
    import torch
    import torch.distributed as dist

    rank = trainlib.get_context().get_world_rank()
    g = torch.ones(4)
    dist.all_reduce(g)  # both ranks: the group works
    if rank == 0:
        dist.all_reduce(g)  # rank 1 never joins this one
    else:
        time.sleep(config["rank1_sleep_s"])
    trainlib.report({"done": 1})


def placement_train_func(config):
    """Write where this rank runs (ranks from the context and the environment, Ray node id) to out_dir."""
    import json

    import ray
    import torch
    import torch.distributed as dist

    ctx = trainlib.get_context()
    t = torch.ones(1)
    dist.all_reduce(t)  # the process group spans the nodes
    info = {
        "rank": ctx.get_world_rank(),
        "node_rank": ctx.get_node_rank(),
        "local_rank": ctx.get_local_rank(),
        "local_world_size": ctx.get_local_world_size(),
        "world_size": ctx.get_world_size(),
        "env": {k: os.environ[k] for k in ("RANK", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")},
        "node_id": ray.get_runtime_context().get_node_id(),
        "all_reduce": float(t[0]),
    }
    with open(os.path.join(config["out_dir"], f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump(info, f)
    trainlib.report({"ok": 1})


def expected_w(epochs: int, world_size: int) -> float:
    """The final ``w`` metric of resumable_train_func after ``epochs`` epochs, computed on the driver."""
    w = 0.0
    for epoch in range(1, epochs + 1):
        w = w * 0.5 + sum(rank + epoch for rank in range(world_size))
    return 4 * w
