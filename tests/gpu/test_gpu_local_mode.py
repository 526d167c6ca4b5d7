"""trainlib's torch layer on a real GPU, in local mode: ``ScalingConfig(num_workers=0, use_gpu=True)``.

Runs only where torch sees a CUDA device (skipped otherwise, so CI on CPUs shows it skipped); needs torch and
trainlib, and no Prefect or MLflow. The function runs in this process, as rank 0 of 1 (docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU tests run on a GPU machine (docs/gpu.md)", allow_module_level=True)
pytest.importorskip("ray", reason="`import trainlib` imports ray: install it on the GPU machine (docs/gpu.md)")

import trainlib  # noqa: E402
import trainlib.torch  # noqa: E402
from trainlib.torch import amp  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def fresh_amp_settings():
    """Each fit here runs in this one process, whose AMP settings ``accelerate`` sets once per worker process."""
    amp.reset()
    yield
    amp.reset()


def _fit(train_func, storage: str, name: str, config: dict | None = None) -> trainlib.Result:
    trainer = trainlib.torch.TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(num_workers=0, use_gpu=True),
        run_config=trainlib.RunConfig(name=name, storage_path=storage, verbose=False),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    return result


def _data(n: int = 96, features: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()  # learnable: the loss must fall
    return x, y


def test_model_and_batches_on_the_gpu(tmp_path):
    x, y = _data()

    def train_func():
        device = trainlib.torch.get_device()
        model = trainlib.torch.prepare_model(torch.nn.Linear(8, 2))
        loader = trainlib.torch.prepare_data_loader(
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16), auto_transfer=True
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        seen, losses = [], []
        for _ in range(5):
            for index, (features, labels) in enumerate(loader):
                seen.append((str(features.device), str(labels.device)))
                # The side stream's copy is the batch itself, not memory still being written.
                assert torch.equal(features.cpu(), x[index * 16 : (index + 1) * 16])
                loss = torch.nn.functional.cross_entropy(model(features), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            trainlib.report({"loss": losses[-1]})
        return {
            "device": str(device),
            "devices": [str(d) for d in trainlib.torch.get_devices()],
            "parameters": {str(p.device) for p in model.parameters()},
            "model": type(model).__name__,
            "batches": set(seen),
            "first_loss": losses[0],
            "last_loss": losses[-1],
        }

    value = _fit(train_func, str(tmp_path), "gpu-local").return_value
    assert value["device"] == "cuda:0" and value["devices"] == ["cuda:0"], value
    assert value["parameters"] == {"cuda:0"} and value["model"] == "Linear", value  # no DDP for one rank
    assert value["batches"] == {("cuda:0", "cuda:0")}, value
    assert value["last_loss"] < value["first_loss"] * 0.8, value


def test_amp_trains_with_float16_autocast_and_a_loss_scale(tmp_path):
    x, y = _data(256, 16)

    def train_func():
        trainlib.torch.accelerate(amp=True)
        net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        model = trainlib.torch.prepare_model(net)
        optimizer = trainlib.torch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.2))
        features, labels = x.cuda(), y.cuda()
        dtypes, losses = set(), []
        for _ in range(60):
            logits = model(features)
            dtypes.add(str(logits.dtype))
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            optimizer.zero_grad()
            trainlib.torch.backward(loss)
            optimizer.step()
            losses.append(loss.item())
        trainlib.report({"loss": losses[-1]})
        return {
            "dtypes": dtypes,
            "parameter_dtypes": {str(p.dtype) for p in model.parameters()},
            "scaler": type(amp.current().scaler).__name__,
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
        }

    value = _fit(train_func, str(tmp_path), "gpu-amp").return_value
    assert value["dtypes"] == {"torch.float16"}, value  # the forward ran under autocast
    assert value["parameter_dtypes"] == {"torch.float32"}, value  # the weights stay float32
    assert value["scaler"] == "GradScaler" and value["finite"], value
    assert value["last_loss"] < value["first_loss"] * 0.7, value


# Loads a checkpoint's state dict in a process that sees no GPU, as a CPU-only machine would.
_LOAD_ON_CPU = r"""
import json, sys, torch
assert not torch.cuda.is_available()
state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
net.load_state_dict(state)
inputs = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps({"devices": sorted({str(t.device) for t in state.values()}), "outputs": net(inputs).tolist()}))
"""


def test_checkpoint_saved_on_the_gpu_loads_on_a_cpu(tmp_path):
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

    def train_func():
        net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        model = trainlib.torch.prepare_model(net)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(10):
            loss = model(torch.randn(32, 8, device="cuda")).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))  # CUDA tensors
            trainlib.report({"loss": loss.item()}, checkpoint=trainlib.Checkpoint.from_directory(folder))
        with torch.no_grad():
            return model(inputs.cuda()).cpu()

    result = _fit(train_func, str(tmp_path), "gpu-checkpoint")
    with result.checkpoint.as_directory() as folder:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.run(
            [sys.executable, "-c", _LOAD_ON_CPU, os.path.join(folder, "model.pt"), json.dumps(inputs.tolist())],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["devices"] == ["cpu"], loaded
    # The same network: the CPU's outputs are the GPU's, to float rounding (TF32 matmuls on the GPU allowed for).
    torch.testing.assert_close(torch.tensor(loaded["outputs"]), result.return_value, atol=2e-3, rtol=2e-3)
