"""DDP is real: gradients are averaged across ranks, and each rank reads its own shard."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import trainlib
from trainlib.torch import TorchTrainer, prepare_data_loader, prepare_model

N_FEATURES = 6
STEPS = 4
LR = 0.1


def _shard(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, N_FEATURES, generator=g) * (rank + 1), torch.randn(8, 1, generator=g)


def _initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(N_FEATURES, 1)


def ddp_train_func():
    rank = trainlib.get_context().get_world_rank()
    model = prepare_model(_initial_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _shard(rank, step)  # every rank trains on different data
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.module.state_dict(), os.path.join(folder, f"weights_rank{rank}.pt"))
        # prepare_model's default: gradients live in DDP's buckets (one copy less per step).
        trainlib.report(
            {"loss": loss.item(), "bucket_view": model.gradient_as_bucket_view},
            checkpoint=trainlib.Checkpoint.from_directory(folder),
        )


def test_ddp_averages_gradients_across_ranks(ray_session, storage_path):
    result = TorchTrainer(
        ddp_train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(storage_path=storage_path, verbose=False),
    ).fit()
    assert result.metrics["bucket_view"] is True
    with result.checkpoint.as_directory() as folder:
        # The files of both ranks are merged into one checkpoint.
        weights = [torch.load(os.path.join(folder, f"weights_rank{r}.pt")) for r in (0, 1)]
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0)

    # One process on both shards at once (mean loss over equal shards = mean of the ranks' gradients).
    reference = _initial_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for step in range(STEPS):
        shards = [_shard(r, step) for r in (0, 1)]
        loss = sum(torch.nn.functional.mse_loss(reference(x), y) for x, y in shards) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(weights[0][name], value, rtol=1e-5, atol=1e-6)
    # Without averaging, rank 0 alone would have drifted elsewhere.
    alone = _initial_model()
    optimizer = torch.optim.SGD(alone.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _shard(0, step)
        loss = torch.nn.functional.mse_loss(alone(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert not torch.allclose(alone.weight, weights[0]["weight"])


class IndexDataset(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def shard_train_func(config):
    rank = trainlib.get_context().get_world_rank()
    loader = DataLoader(IndexDataset(config["n"]), batch_size=5, shuffle=config["shuffle"])
    if config.get("own_sampler"):
        sampler = DistributedSampler(
            IndexDataset(config["n"]), num_replicas=2, rank=rank, shuffle=False, drop_last=True
        )
        loader = DataLoader(IndexDataset(config["n"]), batch_size=5, sampler=sampler)
    loader = prepare_data_loader(loader)
    with tempfile.TemporaryDirectory() as folder:
        for epoch in range(config["epochs"]):
            if trainlib.get_context().get_world_size() > 1:
                loader.sampler.set_epoch(epoch)
            seen = [int(i) for batch in loader for i in batch]
            with open(os.path.join(folder, f"rank{rank}_epoch{epoch}.json"), "w") as f:
                json.dump(
                    {
                        "seen": seen,
                        "sampler": type(loader.sampler).__name__,
                        "drop_last": getattr(loader.sampler, "drop_last", None),
                    },
                    f,
                )
        trainlib.report({"epochs": config["epochs"]}, checkpoint=trainlib.Checkpoint.from_directory(folder))


def _seen(result, rank: int, epoch: int) -> dict:
    with result.checkpoint.as_directory() as folder:
        with open(os.path.join(folder, f"rank{rank}_epoch{epoch}.json")) as f:
            return json.load(f)


def _fit_shards(storage_path, **config):
    return TorchTrainer(
        shard_train_func,
        train_loop_config={"n": 40, "epochs": 2, **config},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(storage_path=storage_path, verbose=False),
    ).fit()


def test_each_rank_reads_a_disjoint_shard_reshuffled_each_epoch(ray_session, storage_path):
    result = _fit_shards(storage_path, shuffle=True)
    orders = {}
    for epoch in (0, 1):
        shards = [_seen(result, rank, epoch)["seen"] for rank in (0, 1)]
        assert _seen(result, 0, epoch)["sampler"] == "DistributedSampler"
        assert len(shards[0]) == len(shards[1]) == 20
        assert not set(shards[0]) & set(shards[1])
        assert set(shards[0]) | set(shards[1]) == set(range(40))
        orders[epoch] = shards[0]
    assert orders[0] != orders[1], "set_epoch must reshuffle"
    assert orders[0] != sorted(orders[0]), "shuffle=True must be kept"


def test_prepare_data_loader_keeps_no_shuffle_and_a_users_sampler(ray_session, storage_path):
    result = _fit_shards(storage_path, shuffle=False)
    # shuffle=False: the DistributedSampler deals indices in order, rank r gets r, r+2, ...
    assert _seen(result, 0, 0)["seen"] == list(range(0, 40, 2))
    assert _seen(result, 1, 1)["seen"] == list(range(1, 40, 2))

    result = _fit_shards(storage_path, shuffle=False, own_sampler=True)
    assert _seen(result, 0, 0)["drop_last"] is True  # the user's own sampler, untouched


@pytest.mark.parametrize("shuffle", [True, False])
def test_prepare_outside_a_worker_changes_nothing(shuffle):
    loader = DataLoader(IndexDataset(10), batch_size=5, shuffle=shuffle)
    assert prepare_data_loader(loader) is loader
    model = torch.nn.Linear(2, 2)
    assert prepare_model(model) is model
