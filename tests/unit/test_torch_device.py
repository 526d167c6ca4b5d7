"""The torch backend's GPU paths (device choice, nccl arguments) and get_device(), without a GPU."""

from __future__ import annotations

import datetime
import queue

import fsspec
import pytest
import torch

from trainlib._internal.execution.session import WorkerSession, set_session
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.torch import TorchConfig, get_device
from trainlib.torch._backend import TorchBackend, process_group_args, select_device


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda that reports GPUs and records set_device, on a machine without any."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.append(index))
    return chosen


def info(rank=0, world_size=2, gpu_index=None):
    return WorkerInfo(
        world_rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        node_rank=0,
        master_addr="10.0.0.7",
        master_port=29501,
        gpu_index=gpu_index,
    )


def test_gpu_worker_uses_the_gpu_ray_gave_it(fake_cuda):
    assert select_device(True, 1) == torch.device("cuda", 1)
    assert select_device(True, None) == torch.device("cuda", 0)
    assert fake_cuda == [1, 0]
    assert select_device(False, 1) == torch.device("cpu")


def test_gpu_requested_without_cuda_says_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="use_gpu=True.*no CUDA device.*set use_gpu=False"):
        select_device(True, 0)


def test_nccl_binds_the_process_group_to_the_workers_gpu():
    device = torch.device("cuda", 1)
    args = process_group_args(TorchConfig(timeout_s=12), info(rank=1, gpu_index=1), device)
    assert args == {
        "backend": "nccl",
        "master_addr": "10.0.0.7",
        "master_port": 29501,
        "rank": 1,
        "world_size": 2,
        "timeout": datetime.timedelta(seconds=12),
        "device_id": device,
    }


def test_gloo_on_cpu_and_an_explicit_backend_wins():
    args = process_group_args(TorchConfig(), info(), torch.device("cpu"))
    assert args["backend"] == "gloo" and "device_id" not in args
    assert process_group_args(TorchConfig(backend="gloo"), info(), torch.device("cuda", 0))["backend"] == "gloo"


def test_on_start_returns_the_device_for_the_session(fake_cuda):
    # World size 1: no process group, only the device choice.
    assert TorchBackend(TorchConfig(), use_gpu=True).on_start(info(world_size=1, gpu_index=2)) == torch.device(
        "cuda", 2
    )


def test_get_device_reads_the_session(tmp_path):
    assert get_device() == torch.device("cpu")  # outside a worker
    storage = RunStorage(fsspec.filesystem("file"), str(tmp_path), "run")
    session = WorkerSession(
        info(world_size=1), AttemptSpec(attempt=0, storage=storage, checkpoint=None, first_step=1), queue.Queue()
    )
    session.device = torch.device("cuda", 3)
    set_session(session)
    try:
        assert get_device() == torch.device("cuda", 3)
    finally:
        set_session(None)
        session.finish()


def test_init_method_is_accepted_as_in_ray_train_and_checked():
    # Ray Train's two values: both mean the same TCP-store rendezvous here, so the process group is the same.
    assert process_group_args(TorchConfig(init_method="tcp"), info(), torch.device("cpu")) == process_group_args(
        TorchConfig(init_method="env"), info(), torch.device("cpu")
    )
    with pytest.raises(ValueError, match="TorchConfig.init_method='file'.*'env' or 'tcp'"):
        TorchConfig(init_method="file")
