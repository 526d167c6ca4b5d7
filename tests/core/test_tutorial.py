"""Ray Train's getting-started tutorial runs with only `ray.train` replaced by `trainlib`."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import FASHION_MNIST_MIRROR, REPO_ROOT, run_script

from tasks.domain.generated_dataset import write_idx_dataset

SEED = os.path.join(REPO_ROOT, "..", "shared", "seed", "tutorial_ray_train.py")
EXAMPLE = os.path.join(REPO_ROOT, "examples", "tutorial.py")

# Appended after the tutorial's last step, to check what it produced.
CHECK = """
import torch as _torch
assert result.error is None, result.error
assert result.metrics["epoch"] == 9, result.metrics
_out = model(_torch.zeros(2, 1, 28, 28))
assert _out.shape == (2, 10), _out.shape
print("TUTORIAL_OK", result.metrics, result.checkpoint)
"""


def converted_seed() -> str:
    """The seed script with `ray.train` replaced by `trainlib` (and no GPU on this machine)."""
    with open(SEED) as f:
        text = f.read()
    return text.replace("ray.train", "trainlib").replace("use_gpu=True", "use_gpu=False")


def test_example_is_exactly_the_converted_seed():
    with open(EXAMPLE) as f:
        example = f.read()
    body = example[example.index("import os") :]
    assert body == converted_seed()[converted_seed().index("import os") :]
    assert "ray" not in body.replace("trainlib", "")  # nothing of Ray Train is left


def _run_tutorial(tmp_path, data_folder: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    # The tutorial reads FashionMNIST from tempfile.gettempdir()/data with download=True;
    # with the raw files in place torchvision downloads nothing.
    return run_script(tmp_path, converted_seed() + CHECK, data_folder, timeout_s)


def test_tutorial_runs_on_generated_fashion_mnist(tmp_path):
    mirror = tmp_path / "mirror"
    write_idx_dataset(mirror, n_train=256, n_test=64, seed=1)
    proc = _run_tutorial(tmp_path, str(mirror))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "TUTORIAL_OK" in proc.stdout
    # Rank 0 prints its metrics each epoch, as the tutorial does.
    assert "'epoch': 9" in proc.stdout + proc.stderr
    runs = os.listdir(tmp_path / "home" / "trainlib_results")
    assert len(runs) == 1
    checkpoints = sorted(
        c for c in os.listdir(tmp_path / "home" / "trainlib_results" / runs[0]) if c.startswith("checkpoint_")
    )
    assert len(checkpoints) == 10


@pytest.mark.timeout(3 * 3600)
@pytest.mark.skipif(
    os.environ.get("TRAINLIB_REAL_TUTORIAL") != "1",
    reason="the full tutorial on the real 60,000 images takes about 20 minutes on 2 cores: "
    "set TRAINLIB_REAL_TUTORIAL=1 (make tutorial runs it as well)",
)
def test_tutorial_runs_on_real_fashion_mnist(tmp_path):
    proc = _run_tutorial(tmp_path, FASHION_MNIST_MIRROR, timeout_s=3 * 3600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "TUTORIAL_OK" in proc.stdout
    print(proc.stdout[-3000:])
