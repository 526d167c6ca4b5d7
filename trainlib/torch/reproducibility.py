"""``enable_reproducibility``: seeds and deterministic kernels for this worker. Runs in worker actors.

As Ray Train's: seeds Python, NumPy and torch, turns on torch's deterministic
algorithms, turns off cuDNN benchmarking, sets the cuBLAS workspace that
deterministic CUDA matmuls need, and makes ``prepare_data_loader`` seed its
shuffling and its loader worker processes from the seed.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

_seed: int | None = None


def enable_reproducibility(seed: int = 0) -> None:
    """Limit the sources of nondeterminism, so that runs with the same seed train the same.

    Call it at the top of the training function, before building the model and
    before ``prepare_data_loader``. On CPUs two runs with the same seed, world
    size and data give bit-identical weights; on GPUs some operations have no
    deterministic kernel and raise (torch's ``use_deterministic_algorithms``).

    Args:
        seed: the seed of Python's, NumPy's and torch's generators and of the data loaders.
    """
    global _seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"enable_reproducibility(seed={seed!r}): seed must be an int.")
    _seed = seed
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # cuBLAS needs a fixed workspace for deterministic results (NVIDIA cuBLAS docs, "Results reproducibility").
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def seed() -> int | None:
    """The seed given to :func:`enable_reproducibility` in this process, or None."""
    return _seed


def seed_loader_worker(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` part: seed NumPy and Python from torch's per-worker seed."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
