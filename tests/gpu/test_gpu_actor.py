"""The actor path on a real GPU: one trainlib worker on Ray with ``use_gpu=True``, and an nccl group of one.

Runs only where torch sees a CUDA device and Ray is installed (skipped otherwise). Ray is started here with the
machine's one GPU (``address="local"``: never a stray cluster) and shut down after the module.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU tests run on a GPU machine (docs/gpu.md)", allow_module_level=True)
ray = pytest.importorskip("ray", reason="the actor path needs Ray on the GPU machine (docs/gpu.md)")

import trainlib  # noqa: E402
import trainlib.torch  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_ray():
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()


def train_func():
    """One worker on Ray's GPU: the device trainlib picked, a few steps on it, and an nccl group of one there."""
    import torch.distributed as dist

    from trainlib._internal.execution.session import current_session
    from trainlib.torch._backend import process_group_args
    from trainlib.torch._process_group import open_store
    from trainlib.torch.config import TorchConfig

    device = trainlib.torch.get_device()
    model = trainlib.torch.prepare_model(torch.nn.Linear(8, 2))
    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long()
    loader = trainlib.torch.prepare_data_loader(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16), auto_transfer=True
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batch_devices = set()
    for features, labels in loader:
        batch_devices.add(str(features.device))
        loss = torch.nn.functional.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # The group trainlib would form for this worker, with the arguments it builds for a GPU (nccl, bound to the
    # device): trainlib forms none for a world of one, so it is formed here, on the worker's own device.
    timeout = datetime.timedelta(seconds=60)
    store = open_store("127.0.0.1", 1, timeout)
    info = dataclasses.replace(current_session().info, master_port=store.port)
    args = process_group_args(TorchConfig(), info, device)
    from trainlib.torch._process_group import init_process_group

    init_process_group(**args, store=store)
    summed = torch.full((4,), 3.0, device=device)
    dist.all_reduce(summed)
    backend = dist.get_backend()
    dist.destroy_process_group()
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
        trainlib.report({"loss": loss.item()}, checkpoint=trainlib.Checkpoint.from_directory(folder))
    return {
        "device": str(device),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "parameters": sorted({str(p.device) for p in model.parameters()}),
        "batches": sorted(batch_devices),
        "backend": backend,
        "args_backend": args["backend"],
        "all_reduce": summed.cpu().tolist(),
    }


def test_one_gpu_worker_trains_on_its_device_and_forms_an_nccl_group(gpu_ray, tmp_path):
    result = trainlib.torch.TorchTrainer(
        train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=1, use_gpu=True),
        run_config=trainlib.RunConfig(name="gpu-actor", storage_path=str(tmp_path), verbose=False),
    ).fit()
    assert result.error is None, result.error
    value = result.return_value
    assert value["device"] == "cuda:0" and value["visible"] not in (None, ""), value  # Ray gave the actor its GPU
    assert value["parameters"] == ["cuda:0"] and value["batches"] == ["cuda:0"], value
    assert value["args_backend"] == "nccl" and value["backend"] == "nccl", value
    assert value["all_reduce"] == [3.0] * 4, value
    with result.checkpoint.as_directory() as folder:
        state = torch.load(os.path.join(folder, "model.pt"), map_location="cpu", weights_only=True)
    assert {str(t.device) for t in state.values()} == {"cpu"}
