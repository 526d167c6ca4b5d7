"""Elastic training: ScalingConfig(num_workers=(min, max)) trains on what the cluster gives, shrinks when a
node is lost and grows when one joins, each time from the latest checkpoint.

This module runs its own ray.cluster_utils cluster (a 1-CPU head, then 1-CPU worker nodes), not the
session's Ray: it shuts that down first and starts it again at the end.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import pytest
from conftest import cluster_utils_cluster

import trainlib
from trainlib import DataParallelTrainer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    with cluster_utils_cluster(head_cpus=1) as (c, _):
        yield c


def elastic_train_func(config):
    ctx = trainlib.get_context()
    start = 0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            start = int(open(os.path.join(folder, "epoch.txt")).read()) + 1
    for epoch in range(start, config["epochs"]):
        time.sleep(config["sleep_s"])
        with tempfile.TemporaryDirectory() as folder:
            if ctx.get_world_rank() == 0:
                open(os.path.join(folder, "epoch.txt"), "w").write(str(epoch))
            trainlib.report(
                {"epoch": epoch, "world_size": ctx.get_world_size(), "start_epoch": start},
                checkpoint=trainlib.Checkpoint.from_directory(folder),
            )


def _run_in_thread(box, train_func=None, trainer_class=None, **trainer_kwargs):
    # DataParallelTrainer by default: workers without torch (the suite's CPU budget); resizing is the same machinery
    # for every trainer. This module must not import torch at top level, or the workers import it anyway.
    def run():
        try:
            trainer = (trainer_class or DataParallelTrainer)(train_func or elastic_train_func, **trainer_kwargs)
            box["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(path, thread, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.1)
    assert path.exists(), f"{path} never appeared"


def test_starts_with_what_fits_then_grows_when_a_node_joins(cluster, tmp_path):
    from trainlib.torch import TorchTrainer  # here, not at the top: the other tests' workers stay without torch

    box = {}
    thread = _run_in_thread(
        box,
        trainer_class=TorchTrainer,  # one elastic run on TorchTrainer: its gloo group re-forms at the new size
        train_loop_config={"epochs": 30, "sleep_s": 0.5},
        scaling_config=trainlib.ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=1),
        run_config=trainlib.RunConfig(name="grow", storage_path=f"file://{tmp_path}/runs", verbose=False),
    )
    _wait_for(tmp_path / "runs" / "grow" / "checkpoint_000002" / ".trainlib_commit.json", thread)
    cluster.add_node(num_cpus=1)  # room for a second worker appears
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in box, box.get("error")
    frame = box["result"].metrics_dataframe
    assert frame["world_size"].iloc[0] == 1  # the cluster had room for one: it started with one
    assert frame["world_size"].iloc[-1] == 2  # and grew
    grown = frame[frame["world_size"] == 2]
    assert grown["start_epoch"].iloc[0] >= 2  # from the latest checkpoint, not from the start
    assert list(frame["epoch"].drop_duplicates()) == list(range(30))


def test_losing_a_node_continues_with_fewer_workers_from_the_last_checkpoint(cluster, tmp_path):
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the head and the node the first test added
    box = {}
    thread = _run_in_thread(
        box,
        train_loop_config={"epochs": 12, "sleep_s": 0.5},
        scaling_config=trainlib.ScalingConfig(num_workers=(1, 2)),
        run_config=trainlib.RunConfig(
            name="shrink",
            storage_path=f"file://{tmp_path}/runs",
            verbose=False,
            failure_config=trainlib.FailureConfig(max_failures=1),
        ),
    )
    _wait_for(tmp_path / "runs" / "shrink" / "checkpoint_000003" / ".trainlib_commit.json", thread)
    victim = next(n for n in cluster.worker_nodes)
    cluster.remove_node(victim, allow_graceful=False)
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in box, box.get("error")
    frame = box["result"].metrics_dataframe
    assert frame["world_size"].iloc[0] == 2
    after = frame[frame["attempt"] == frame["attempt"].max()]
    assert set(after["world_size"]) == {1}  # continued on the node that is left
    assert after["start_epoch"].iloc[0] >= 3  # from the last checkpoint
    assert after["start_epoch"].iloc[0] - 1 in set(frame[frame["checkpoint"].notna()]["epoch"])
    assert box["result"].metrics["epoch"] == 11


def preemptible_train_func(config):
    ctx = trainlib.get_context()
    start = 0
    checkpoint = trainlib.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            start = int(open(os.path.join(folder, "epoch.txt")).read()) + 1
    for epoch in range(start, config["epochs"]):
        time.sleep(config["sleep_s"])
        info = trainlib.get_preemption_info()
        with tempfile.TemporaryDirectory() as folder:
            if ctx.get_world_rank() == 0:
                open(os.path.join(folder, "epoch.txt"), "w").write(str(epoch))
            trainlib.report(
                {
                    "epoch": epoch,
                    "world_size": ctx.get_world_size(),
                    "start_epoch": start,
                    "preempted_ranks": info.preempted_ranks if info else None,
                    "deadline_ms": info.deadline_ms if info else None,
                },
                checkpoint=trainlib.Checkpoint.from_directory(folder),
            )


def test_a_preempted_node_is_announced_and_its_loss_uses_the_preemption_budget(cluster, tmp_path):
    import json

    import ray
    from ray._private import services
    from ray.core.generated import autoscaler_pb2

    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    box = {}
    thread = _run_in_thread(
        box,
        train_func=preemptible_train_func,
        train_loop_config={"epochs": 40, "sleep_s": 0.5},
        scaling_config=trainlib.ScalingConfig(num_workers=(1, 2)),
        run_config=trainlib.RunConfig(
            name="preempt",
            storage_path=f"file://{tmp_path}/runs",
            verbose=False,
            failure_config=trainlib.FailureConfig(max_failures=0),
        ),
    )
    run = tmp_path / "runs" / "preempt"
    _wait_for(run / "checkpoint_000002" / ".trainlib_commit.json", thread)
    deadline_ms = int(time.time() * 1000) + 600_000
    gcs = ray._raylet.GcsClient(address=services.canonicalize_bootstrap_address_or_die(addr="auto"))
    accepted, _ = gcs.drain_node(
        node.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), "spot reclaim", deadline_ms
    )
    assert accepted

    def announced():
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["metrics"] for r in rows if r["metrics"]["preempted_ranks"]]

    limit = time.monotonic() + 60
    while not announced() and time.monotonic() < limit and thread.is_alive():
        time.sleep(0.2)
    seen = announced()
    assert seen and len(seen[0]["preempted_ranks"]) == 1 and seen[0]["deadline_ms"] == deadline_ms
    cluster.remove_node(node, allow_graceful=False)  # the reclaim
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in box, box.get("error")  # max_failures=0, yet the run went on
    frame = box["result"].metrics_dataframe
    assert frame["world_size"].iloc[-1] == 1 and box["result"].metrics["epoch"] == 39
