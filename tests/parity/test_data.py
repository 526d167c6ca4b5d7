"""Ray Data: TorchTrainer / DataParallelTrainer(datasets=..., dataset_config=DataConfig(...)) and
trainlib.get_dataset_shard(name).

The shards come from Ray Data's own streaming_split: each epoch every worker reads a disjoint part of the
dataset, streamed through a bounded object store budget, so the dataset need not fit anywhere at once.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pytest
from ray import cloudpickle

import trainlib
from trainlib import DataParallelTrainer
from trainlib.torch import TorchTrainer

# Ray Data's tasks (map_batches) run in plain Ray workers, which cannot import this test folder: ship this
# module's functions by value, with Ray's copy of cloudpickle (trainlib's and Ray Data's pickler).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N_ROWS = 100_000
N_FEATURES = 256  # 1 KiB of float32 features per row: ~100 MB per epoch in all
OBJECT_STORE_BUDGET = 32 * 1024 * 1024  # what Ray Data may hold in the object store at once


def add_features(batch: dict) -> dict:
    """The preprocessing step (map_batches): features and a learnable target from the row id."""
    ids = batch["id"].astype(np.int64)
    rng = np.random.default_rng(ids[0])
    x = rng.standard_normal((len(ids), N_FEATURES), dtype=np.float32)
    return {"id": ids, "x": x, "y": x[:, :4].sum(axis=1, keepdims=True).astype(np.float32)}


def streaming_train_func(config):
    import psutil
    import torch

    from trainlib.torch import prepare_model

    rank = trainlib.get_context().get_world_rank()
    model = prepare_model(torch.nn.Linear(N_FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    process = psutil.Process()
    for epoch in range(config["epochs"]):
        shard = trainlib.get_dataset_shard("train")
        baseline = process.memory_full_info().uss
        peak = 0
        seen, losses = [], []
        for batch in shard.iter_torch_batches(batch_size=2048):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(batch["id"].numpy())
            losses.append(loss.item())
            peak = max(peak, process.memory_full_info().uss - baseline)
        np.save(os.path.join(config["out"], f"ids_rank{rank}_epoch{epoch}.npy"), np.concatenate(seen))
        trainlib.report(
            {
                "epoch": epoch,
                "rows": int(sum(len(s) for s in seen)),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "peak_uss_growth": peak,
            }
        )


@pytest.mark.long
def test_a_100k_row_dataset_streams_into_two_workers_with_disjoint_shards(ray_session, storage_path, tmp_path):
    import ray
    from ray.data import ExecutionOptions, ExecutionResources

    dataset = ray.data.range(N_ROWS, override_num_blocks=50).map_batches(add_features, batch_size=2000)
    budget = ExecutionOptions(resource_limits=ExecutionResources(object_store_memory=OBJECT_STORE_BUDGET))
    result = TorchTrainer(
        streaming_train_func,
        train_loop_config={"epochs": 2, "out": str(tmp_path)},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="ray-data", storage_path=storage_path, verbose=False),
        datasets={"train": dataset},
        dataset_config=trainlib.DataConfig(execution_options=budget),
    ).fit()
    frame = result.metrics_dataframe
    for epoch in range(2):
        ids = [np.load(tmp_path / f"ids_rank{rank}_epoch{epoch}.npy") for rank in (0, 1)]
        assert not np.intersect1d(ids[0], ids[1]).size  # disjoint shards
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(N_ROWS))  # that cover every row once
        assert abs(len(ids[0]) - len(ids[1])) <= 1  # equal=True: the same share each
    assert result.metrics["last_loss"] < result.metrics["first_loss"]  # it trains
    # It streams: each worker read ~50 MB per epoch through a 32 MB object store budget, and its own memory
    # grew by far less than its share (a materialised shard would hold all of it).
    per_worker_bytes = N_ROWS // 2 * (N_FEATURES + 2) * 4
    assert frame["peak_uss_growth"].max() < per_worker_bytes / 2, frame["peak_uss_growth"].tolist()


def small_dataset_train_func(config):
    import torch

    checkpoint = trainlib.get_checkpoint()
    start = 0
    if checkpoint:
        with checkpoint.as_directory() as folder:
            start = int(open(os.path.join(folder, "epoch.txt")).read()) + 1
    for epoch in range(start, 3):
        rows = sum(len(b["id"]) for b in trainlib.get_dataset_shard("train").iter_batches(batch_size=100))
        evals = sum(len(b["id"]) for b in trainlib.get_dataset_shard("eval").iter_batches(batch_size=100))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "epoch.txt"), "w") as f:
                f.write(str(epoch))
            trainlib.report(
                {"epoch": epoch, "rows": rows, "eval_rows": evals},
                checkpoint=trainlib.Checkpoint.from_directory(folder),
            )
        if epoch == 1 and not config.get("restored") and torch.distributed.get_rank() == 1:
            raise RuntimeError("planned failure after epoch 1")


def test_restore_takes_the_datasets_again_and_continues(ray_session, storage_path):
    import ray

    datasets = {"train": ray.data.range(1000), "eval": ray.data.range(300)}
    config = trainlib.DataConfig(datasets_to_split=["train"])  # eval reaches every worker whole
    with pytest.raises(trainlib.WorkerGroupError):
        TorchTrainer(
            small_dataset_train_func,
            train_loop_config={},
            datasets=datasets,
            dataset_config=config,
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(name="data-restore", storage_path=storage_path, verbose=False),
        ).fit()
    path = os.path.join(storage_path, "data-restore")
    with pytest.raises(ValueError, match=r"datasets \['eval', 'train'\]"):
        TorchTrainer.restore(path)
    result = TorchTrainer.restore(path, datasets=datasets, train_loop_config={"restored": True}).fit()
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2]  # epoch 2 ran after the restore only
    assert result.metrics["rows"] == 500 and result.metrics["eval_rows"] == 300


def test_datasets_are_checked_before_anything_starts():
    with pytest.raises(TypeError, match=r"datasets\['train'\] is list"):
        TorchTrainer(small_dataset_train_func, train_loop_config={}, datasets={"train": [1, 2]})
    with pytest.raises(ValueError, match="names \\['test'\\]"):
        import ray

        TorchTrainer(
            small_dataset_train_func,
            train_loop_config={},
            datasets={"train": ray.data.range(3)},
            dataset_config=trainlib.DataConfig(datasets_to_split=["test"]),
        )
    with pytest.raises(TypeError, match="datasets_to_split"):
        trainlib.DataConfig(datasets_to_split="train")


def count_rows_func(config):
    rows = sum(len(batch["id"]) for batch in trainlib.get_dataset_shard("train").iter_batches(batch_size=8))
    trainlib.report({"rows": rows})


@pytest.mark.timeout(300)
def test_workers_holding_every_cpu_get_a_warning_that_ray_data_has_none(ray_session, storage_path, caplog):
    """The session Ray has 4 CPUs; two 2-CPU workers leave none for Ray Data's tasks. A materialized
    dataset needs none, so this run trains (an unmaterialized one would wait forever: hence the warning)."""
    import ray

    dataset = ray.data.range(40).materialize()  # its tasks run now, while the CPUs are free
    total = ray.cluster_resources()["CPU"]
    with caplog.at_level("WARNING", logger="trainlib"):
        # DataParallelTrainer: workers without torch (the suite's CPU budget); count_rows_func uses none, and this
        # module is pickled by value, so the workers never import it (nor its torch imports).
        result = DataParallelTrainer(
            count_rows_func,
            datasets={"train": dataset},
            scaling_config=trainlib.ScalingConfig(num_workers=2, resources_per_worker={"CPU": total / 2}),
            run_config=trainlib.RunConfig(name="no-cpu-for-data", storage_path=storage_path),
        ).fit()
    assert result.error is None and result.metrics["rows"] == 20
    [warning] = [r.getMessage() for r in caplog.records if "Ray Data's read and map tasks" in r.getMessage()]
    assert "'train'" in warning and "resources_per_worker" in warning and "ray.init(num_cpus=" in warning


def test_local_mode_reads_each_dataset_whole(ray_session, storage_path):
    """ScalingConfig(num_workers=0): the one rank, in this process, reads the whole dataset (no split)."""
    import ray

    result = DataParallelTrainer(
        count_rows_func,
        datasets={"train": ray.data.range(40)},
        scaling_config=trainlib.ScalingConfig(num_workers=0),
        run_config=trainlib.RunConfig(name="local-data", storage_path=storage_path, verbose=False),
    ).fit()
    assert result.error is None and result.metrics["rows"] == 40
