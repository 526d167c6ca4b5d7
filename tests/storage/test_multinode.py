"""Several Ray nodes on one machine (ray.cluster_utils.Cluster): ranks per node, storage, node loss.

Nodes: the head with 2 CPUs and two 1-CPU nodes. This module runs its own cluster,
not the session's Ray (it shuts that down first and starts it again at the end).
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from conftest import cluster_utils_cluster
from storage_helpers import expected_w, placement_train_func, resumable_train_func

import trainlib
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    with cluster_utils_cluster(head_cpus=2, node_cpus=(1, 1)) as (c, workers):
        yield c, workers


def read_ranks(out_dir, world_size):
    infos = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            infos.append(json.load(f))
    return infos


def test_ranks_per_node_pack_all_cpus(cluster, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    result = TorchTrainer(
        placement_train_func,
        train_loop_config={"out_dir": str(out)},
        scaling_config=trainlib.ScalingConfig(num_workers=4, placement_strategy="PACK"),
        run_config=trainlib.RunConfig(name="ranks", storage_path=f"file://{tmp_path}/runs"),
    ).fit()
    assert result.error is None
    infos = read_ranks(out, 4)
    nodes = [i["node_id"] for i in infos]
    assert len(set(nodes)) == 3  # 4 workers on 2 + 1 + 1 CPUs
    # Ranks of one node are contiguous; node ranks count nodes in rank order.
    order = list(dict.fromkeys(nodes))
    for info in infos:
        peers = [j for j in infos if j["node_id"] == info["node_id"]]
        assert info["node_rank"] == order.index(info["node_id"])
        assert info["local_world_size"] == len(peers)
        assert info["local_rank"] == sorted(p["rank"] for p in peers).index(info["rank"])
        assert info["env"] == {
            "RANK": str(info["rank"]),
            "NODE_RANK": str(info["node_rank"]),
            "LOCAL_RANK": str(info["local_rank"]),
            "LOCAL_WORLD_SIZE": str(info["local_world_size"]),
            "WORLD_SIZE": "4",
        }
        assert info["all_reduce"] == 4.0
    assert sorted(i["local_world_size"] for i in infos) == [1, 1, 2, 2]


def test_strict_spread_puts_one_worker_per_node(cluster, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    TorchTrainer(
        placement_train_func,
        train_loop_config={"out_dir": str(out)},
        scaling_config=trainlib.ScalingConfig(num_workers=3, placement_strategy="STRICT_SPREAD"),
        run_config=trainlib.RunConfig(name="spread", storage_path=f"file://{tmp_path}/runs"),
    ).fit()
    infos = read_ranks(out, 3)
    assert len({i["node_id"] for i in infos}) == 3
    assert [(i["node_rank"], i["local_rank"], i["local_world_size"]) for i in infos] == [
        (0, 0, 1),
        (1, 0, 1),
        (2, 0, 1),
    ]


def test_local_storage_path_on_several_nodes_fails_before_training(cluster, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    storage_path = str(tmp_path / "runs")
    started = time.monotonic()
    with pytest.raises(trainlib.StorageError) as info:
        TorchTrainer(
            placement_train_func,
            train_loop_config={"out_dir": str(out)},
            scaling_config=trainlib.ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
            run_config=trainlib.RunConfig(name="local", storage_path=storage_path),
        ).fit()
    text = str(info.value)
    assert "2 nodes" in text and storage_path in text and "s3://" in text and "file://" in text, text
    assert "shared" in text
    assert os.listdir(out) == []  # the training function never ran
    assert not os.path.exists(os.path.join(storage_path, "local", "metrics.jsonl"))
    # Not a speed figure: no wait for a timeout. It starts actors on both nodes first (62 s were seen
    # under a load of 15 on 2 cores; ~10 s quiet).
    assert time.monotonic() - started < 180


def test_node_loss_restarts_the_group_on_the_remaining_nodes(cluster, tmp_path):
    c, workers = cluster
    node_dir = tmp_path / "nodes"
    node_dir.mkdir()
    storage_path = f"file://{tmp_path}/runs"
    epochs = 8
    box = {}

    def run():
        try:
            box["result"] = TorchTrainer(
                resumable_train_func,
                train_loop_config={"epochs": epochs, "ckpt_every": 2, "sleep_s": 0.5, "node_dir": str(node_dir)},
                scaling_config=trainlib.ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
                run_config=trainlib.RunConfig(
                    name="node-loss", storage_path=storage_path, failure_config=trainlib.FailureConfig(max_failures=1)
                ),
            ).fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    marker = tmp_path / "runs" / "node-loss" / "checkpoint_000002" / ".trainlib_commit.json"
    deadline = time.monotonic() + 180
    while not marker.exists() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.1)
    assert marker.exists(), box
    used = {(node_dir / f"attempt0_rank{r}").read_text() for r in range(2)}
    victim = next(n for n in workers if n.node_id in used)  # never the head: it holds the driver's cluster
    c.remove_node(victim, allow_graceful=False)
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.metrics["epoch"] == epochs and result.metrics["w"] == expected_w(epochs, 2)
    df = result.metrics_dataframe
    restarted = df[df["attempt"] == 1]
    assert len(restarted) and restarted["start_epoch"].iloc[0] >= 3  # resumed, not from epoch 1
    assert restarted["start_epoch"].iloc[0] - 1 in set(df[df["checkpoint"].notna()]["epoch"])
    after = {(node_dir / f"attempt1_rank{r}").read_text() for r in range(2)}
    assert victim.node_id not in after and len(after) == 2
