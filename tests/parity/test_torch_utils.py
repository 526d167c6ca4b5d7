"""Ray Train's torch helpers: enable_reproducibility, accelerate/backward/prepare_optimizer (AMP), get_devices,
prepare_model(parallel_strategy="fsdp") and prepare_data_loader(auto_transfer=...)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainlib
import trainlib.torch as tt
from trainlib.torch import TorchTrainer


def _run(func, storage_path, config=None, num_workers=2, name=None):
    return TorchTrainer(
        func,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(num_workers=num_workers),
        run_config=trainlib.RunConfig(name=name, storage_path=storage_path, verbose=False),
    ).fit()


# -- enable_reproducibility ---------------------------------------------------------


def seeded_train_func(config):
    tt.enable_reproducibility(config["seed"])
    # Random init, dropout, shuffling and random data: all of them must follow the seed.
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = tt.prepare_model(model)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = tt.prepare_data_loader(DataLoader(data, batch_size=16, shuffle=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        if trainlib.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        if trainlib.get_context().get_world_rank() == 0:
            torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
        trainlib.report({"loss": loss.item()}, checkpoint=trainlib.Checkpoint.from_directory(folder))


def _weights(result):
    with result.checkpoint.as_directory() as folder:
        return torch.load(os.path.join(folder, "model.pt"))


def test_two_runs_with_the_same_seed_give_bit_identical_weights(ray_session, storage_path):
    first = _weights(_run(seeded_train_func, storage_path, {"seed": 7}))
    second = _weights(_run(seeded_train_func, storage_path, {"seed": 7}))
    other = _weights(_run(seeded_train_func, storage_path, {"seed": 8}))
    for name in first:
        assert torch.equal(first[name], second[name]), name  # bit-identical, not merely close
    assert any(not torch.equal(first[n], other[n]) for n in first)  # and the seed matters


def test_enable_reproducibility_sets_the_deterministic_switches():
    try:
        tt.enable_reproducibility(3)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        a = torch.rand(3)
        tt.enable_reproducibility(3)
        assert torch.equal(a, torch.rand(3))
    finally:
        torch.use_deterministic_algorithms(False)
    with pytest.raises(TypeError, match="seed must be an int"):
        tt.enable_reproducibility("3")


# -- AMP: accelerate, prepare_optimizer, backward ------------------------------------


def amp_train_func():
    tt.accelerate(amp=True)
    model = tt.prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = tt.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    g = torch.Generator().manual_seed(trainlib.get_context().get_world_rank())
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.5  # learnable: a linear target
    losses, dtypes = [], set()
    for _ in range(40):
        out = model(x)
        dtypes.add(str(out.dtype))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        tt.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    param_dtypes = sorted({str(p.dtype) for p in model.parameters()})
    try:
        tt.accelerate(amp=True)
        twice = "no error"
    except RuntimeError as exc:
        twice = str(exc)
    trainlib.report(
        {
            "first": losses[0],
            "last": losses[-1],
            "out_dtypes": sorted(dtypes),
            "param_dtypes": param_dtypes,
            "twice": twice,
        }
    )


def test_amp_on_cpu_runs_forward_in_bfloat16_and_trains(ray_session, storage_path):
    metrics = _run(amp_train_func, storage_path).metrics
    assert metrics["out_dtypes"] == ["torch.bfloat16"]  # forward ran under autocast
    assert metrics["param_dtypes"] == ["torch.float32"]  # the weights stay full precision
    assert metrics["last"] < metrics["first"] * 0.8  # and it learns
    assert "already been set" in metrics["twice"]


def test_each_local_mode_fit_starts_with_fresh_amp_settings(storage_path):
    """Two local-mode runs in one process each call accelerate(): the second is not refused by the first's."""
    first = _run(amp_train_func, storage_path, num_workers=0, name="amp-local-1").metrics
    second = _run(amp_train_func, storage_path, num_workers=0, name="amp-local-2").metrics
    assert first["out_dtypes"] == second["out_dtypes"] == ["torch.bfloat16"]
    assert "already been set" in second["twice"]  # within one run, a second call is still refused


def test_backward_and_prepare_optimizer_without_amp_are_the_plain_calls():
    from trainlib.torch import amp

    amp.reset()
    try:
        model = torch.nn.Linear(3, 1)
        optimizer = tt.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
        before = model.weight.detach().clone()
        tt.backward(model(torch.ones(2, 3)).sum())
        assert model.weight.grad is not None
        optimizer.step()
        assert not torch.equal(before, model.weight)
        assert optimizer.param_groups[0]["lr"] == 1.0
        with pytest.raises(RuntimeError, match="already been set"):
            tt.accelerate(amp=True)  # after a prepare call
    finally:
        amp.reset()


def test_get_devices_outside_a_worker_is_the_cpu():
    assert tt.get_devices() == [torch.device("cpu")]
    assert tt.get_device() == torch.device("cpu")


# -- FSDP ---------------------------------------------------------------------------


def _fsdp_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def fsdp_train_func(config):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.tensor import DTensor

    rank = trainlib.get_context().get_world_rank()
    model = tt.prepare_model(_fsdp_model(), parallel_strategy="fsdp")
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    local_numel = sum(p.to_local().numel() for p in model.parameters())
    full_numel = sum(p.numel() for p in model.parameters())
    checkpoint = trainlib.get_checkpoint()
    resumed_checksum = None
    if checkpoint:  # the full state dict (one file, rank 0 wrote it) goes back into the sharded model
        with checkpoint.as_directory() as folder:
            full = torch.load(os.path.join(folder, "full_model.pt"))
        expected = {k: v.clone() for k, v in full.items()}  # set_model_state_dict shards the dict it is given
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        gathered = {
            k: v.full_tensor() if isinstance(v, DTensor) else v  # the full weights, on every rank
            for k, v in get_model_state_dict(model).items()
        }
        resumed_checksum = float(sum(v.double().sum() for v in gathered.values()))
        assert all(torch.equal(gathered[k], expected[k]) for k in expected)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    losses = []
    for _ in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    with tempfile.TemporaryDirectory() as folder:
        # Sharded: every rank writes its own shard files (torch.distributed.checkpoint); they are
        # merged into one checkpoint folder. Full: rank 0 writes the whole model as one file.
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=os.path.join(folder, "sharded"))
        if rank == 0:
            torch.save(full, os.path.join(folder, "full_model.pt"))
        trainlib.report(
            {
                "first": losses[0],
                "last": losses[-1],
                "sharded": sharded,
                "local_numel": local_numel,
                "full_numel": full_numel,
                "resumed_checksum": resumed_checksum,
                "checksum": float(sum(v.double().sum() for v in full.values())),
            },
            checkpoint=trainlib.Checkpoint.from_directory(folder),
        )


def test_fsdp_on_two_cpu_workers_trains_and_checkpoints_sharded_and_full(ray_session, storage_path, tmp_path):
    import torch.distributed.checkpoint as dcp

    result = _run(fsdp_train_func, storage_path, {"steps": 15}, name="fsdp")
    m = result.metrics
    assert m["sharded"] is True
    assert m["local_numel"] < m["full_numel"]  # each rank holds a part of the parameters
    assert m["last"] < m["first"]
    with result.checkpoint.as_directory() as folder:
        files = sorted(os.listdir(os.path.join(folder, "sharded")))
        assert ".metadata" in files and sum(f.endswith(".distcp") for f in files) == 2  # both ranks' shards
        full = torch.load(os.path.join(folder, "full_model.pt"))
        # The sharded checkpoint, read back without any process group, is the full state dict.
        from_shards = {"model": {k: torch.empty_like(v) for k, v in full.items()}}
        dcp.load(from_shards, checkpoint_id=os.path.join(folder, "sharded"), no_dist=True)
    for key, value in full.items():
        assert torch.equal(from_shards["model"][key], value), key
    plain = _fsdp_model()
    plain.load_state_dict(full)  # the full state dict loads into the plain, unwrapped model
    assert abs(sum(float(v.double().sum()) for v in plain.state_dict().values()) - m["checksum"]) < 1e-6

    # Full -> sharded: a second run loads the full state dict into its FSDP model.
    resumed = TorchTrainer(
        fsdp_train_func,
        train_loop_config={"steps": 1},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="fsdp-resumed", storage_path=storage_path, verbose=False),
        resume_from_checkpoint=result.checkpoint,
    ).fit()
    assert resumed.metrics["resumed_checksum"] == pytest.approx(m["checksum"], abs=1e-6)


def test_fsdp_kwargs_are_checked():
    with pytest.raises(ValueError, match="parallel_strategy"):
        tt.prepare_model(torch.nn.Linear(2, 2), parallel_strategy="zero3")


# -- prepare_data_loader(auto_transfer=...) -----------------------------------------


def test_prepare_data_loader_takes_auto_transfer_and_keeps_cpu_batches():
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    for auto_transfer in (True, False):
        prepared = tt.prepare_data_loader(loader, auto_transfer=auto_transfer)
        batches = [b[0] for b in prepared]
        assert torch.equal(torch.cat(batches), torch.arange(10.0))
        assert len(prepared) == 3
