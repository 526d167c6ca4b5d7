"""Training functions of the fault tests, shipped to the Ray workers.

The fault tests run them on ``DataParallelTrainer`` (but the staged-uploads one, see its module): commits, leases, restarts and storage are the
same machinery for every trainer, and its workers start without importing torch (about 2 s of CPU
each on the 2-core CI, a third of the suite's CPU went to worker start-ups). Keep this module and
the test modules that define training functions free of torch imports, or the workers import it anyway.
"""

from __future__ import annotations

import os
import tempfile
import time

import trainlib


def symlink_train_func(config):
    """Report a good checkpoint, then one whose folder holds a symlink (config['link_to'])."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "state.txt"), "w") as f:
            f.write("good")
        trainlib.report({"step": 1}, checkpoint=trainlib.Checkpoint.from_directory(folder))
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "state.txt"), "w") as f:
            f.write("second")
        os.symlink(config["link_to"], os.path.join(folder, config.get("link_name", "leak")))
        trainlib.report({"step": 2}, checkpoint=trainlib.Checkpoint.from_directory(folder))


def straggler_train_func(config):
    """Rank 0 finishes at once; rank 1 keeps running for config['rank1_sleep_s'] seconds."""
    trainlib.report({"x": 1})
    if trainlib.get_context().get_world_rank() == 1:
        time.sleep(config["rank1_sleep_s"])


def steps_train_func(config):
    """config['steps'] reports with a small checkpoint (model file from both ranks when config['both']); resumes."""
    ctx = trainlib.get_context()
    start = 1
    if trainlib.get_checkpoint() is not None:
        with trainlib.get_checkpoint().as_directory() as folder:
            start = int(open(os.path.join(folder, "step.txt")).read()) + 1
    for step in range(start, config["steps"] + 1):
        with tempfile.TemporaryDirectory() as folder:
            if ctx.get_world_rank() == 0:
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
            if ctx.get_world_rank() == 0 or config.get("both"):
                with open(os.path.join(folder, config.get("file", "model.pt")), "w") as f:
                    f.write(f"rank{ctx.get_world_rank()} step{step}")
                if config.get("big_bytes"):
                    with open(os.path.join(folder, "big.bin"), "wb") as f:
                        f.write(os.urandom(config["big_bytes"]))
            trainlib.report({"step": step}, checkpoint=trainlib.Checkpoint.from_directory(folder))
        time.sleep(config.get("sleep_s", 0))


def sharded_train_func(config):
    """Each rank saves its own shard every step; rank 1 SIGKILLs itself right after report config['die_after']."""
    import signal

    ctx = trainlib.get_context()
    rank = ctx.get_world_rank()
    if config.get("upload_delay_s") and ctx.get_attempt() == 0:
        _slow_down_uploads(config["upload_delay_s"])
    start = 1
    if trainlib.get_checkpoint() is not None:
        with trainlib.get_checkpoint().as_directory() as folder:
            start = int(open(os.path.join(folder, "step.txt")).read()) + 1
    for step in range(start, config["steps"] + 1):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, f"shard_{rank}.txt"), "w") as f:
                f.write(f"step{step}")
            if rank == 0:
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
            trainlib.report({"step": step, "start": start}, checkpoint=trainlib.Checkpoint.from_directory(folder))
        if rank == 1 and step == config["die_after"] and ctx.get_attempt() == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def _slow_down_uploads(delay_s: float) -> None:
    """Fault injection: this worker's checkpoint uploads take ``delay_s`` more per file (slow storage)."""
    from trainlib._internal.execution.session import current_session

    storage = current_session().storage
    upload = storage._upload_file

    def slow_upload(local_file, dest):
        time.sleep(delay_s)
        upload(local_file, dest)

    storage._upload_file = slow_upload


def counting_train_func(config):
    """Deterministic and resumable: w = w/2 + epoch each epoch; a checkpoint every epoch; sleeps config['sleep_s']."""
    start, w = 1, 0.0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            epoch, w = open(os.path.join(folder, "state.txt")).read().split()
            start, w = int(epoch) + 1, float(w)
    for epoch in range(start, config["epochs"] + 1):
        w = w / 2 + epoch
        time.sleep(config.get("sleep_s", 0))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.txt"), "w") as f:
                f.write(f"{epoch} {w!r}")
            trainlib.report(
                {"epoch": epoch, "w": w, "start_epoch": start}, checkpoint=trainlib.Checkpoint.from_directory(folder)
            )


def expected_w(epochs: int) -> float:
    w = 0.0
    for epoch in range(1, epochs + 1):
        w = w / 2 + epoch
    return w
