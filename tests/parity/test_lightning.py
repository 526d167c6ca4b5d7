"""Ray Train's PyTorch Lightning getting-started example (FashionMNIST, ResNet18; examples/lightning_fashion_mnist.py)
runs with only its imports changed (and 2 epochs instead of 10), on 2 workers of a fresh process, on a few generated
images; prepare_trainer and
the callback refuse what Ray Train refuses."""

from __future__ import annotations

import os

from conftest import REPO_ROOT, run_script

from tasks.domain.generated_dataset import write_idx_dataset

EXAMPLE = os.path.join(REPO_ROOT, "examples", "lightning_fashion_mnist.py")

# Appended after the example's last step, to check what it produced.
CHECK = """
import lightning.pytorch as _pl
import torch as _torch
from lightning.pytorch.plugins.environments import LightningEnvironment as _Env
assert result.error is None, result.error
# 256 images, 2 workers, batches of 128: one step per epoch each when the sampler shards by trainlib's ranks.
assert result.metrics["epoch"] == 1 and result.metrics["step"] == 2, result.metrics
assert "loss" in result.metrics and len(result.metrics_dataframe) == 2, result.metrics
assert model(_torch.zeros(2, 1, 28, 28)).shape == (2, 10)
for _trainer, _expected in [
    (_pl.Trainer(strategy="ddp", accelerator="cpu", devices=1), "Invalid strategy class"),
    (_pl.Trainer(strategy=trainlib.lightning.RayDDPStrategy(), plugins=[_Env()], accelerator="cpu"),
     "Invalid cluster environment"),
]:
    try:
        trainlib.lightning.prepare_trainer(_trainer)
    except RuntimeError as _exc:
        assert _expected in str(_exc), _exc
    else:
        raise AssertionError(_expected)
try:
    trainlib.lightning.RayTrainReportCallback(validation=True)
except ValueError as _exc:
    assert "asynchronous checkpoint validation" in str(_exc)
else:
    raise AssertionError("validation=True accepted")
print("LIGHTNING_OK", len(result.metrics_dataframe))
"""


def test_example_is_ray_trains_with_imports_changed():
    with open(EXAMPLE) as f:
        text = f.read()
    body = text[text.index("import os") :]
    assert "import ray" not in body and "ray.train" not in body  # nothing of Ray Train is left
    assert "trainlib.lightning.RayDDPStrategy()" in body and "trainlib.lightning.prepare_trainer(trainer)" in body


def test_lightning_example_runs_on_two_workers(tmp_path):
    mirror = tmp_path / "mirror"
    write_idx_dataset(mirror, n_train=256, n_test=64, seed=1)
    with open(EXAMPLE) as f:
        text = f.read()
    assert "max_epochs=10," in text
    proc = run_script(tmp_path, text.replace("max_epochs=10,", "max_epochs=2,") + CHECK, str(mirror))  # 2 steps
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "LIGHTNING_OK 2" in proc.stdout
    runs = os.listdir(tmp_path / "home" / "trainlib_results")
    checkpoints = [c for c in os.listdir(tmp_path / "home" / "trainlib_results" / runs[0]) if c.startswith("checkp")]
    assert len(checkpoints) == 2
