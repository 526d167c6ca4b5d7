"""Shared fixtures: a local Ray cluster for the session, free ports, tiny FashionMNIST-format data."""

from __future__ import annotations

import os
import socket

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The official FashionMNIST files beside the checkout; FASHION_MNIST_MIRROR names them elsewhere (git worktrees).
FASHION_MNIST_MIRROR = os.environ.get("FASHION_MNIST_MIRROR") or os.path.abspath(
    os.path.join(REPO_ROOT, "..", "shared", "datasets", "fashion-mnist"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray cluster for every test that needs one (4 logical CPUs on the 2-core CI)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # address="local": never join another cluster on this machine (/tmp/ray/ray_current_cluster).
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=True)
    yield ray
    ray.shutdown()


@pytest.fixture
def fast_retries(monkeypatch):
    """Storage retries without the waits (same number of attempts)."""
    from trainlib._internal import tunables

    monkeypatch.setattr(tunables, "STORAGE_RETRY_BASE_DELAY_S", 0.001)
    monkeypatch.setattr(tunables, "STORAGE_RETRY_MAX_DELAY_S", 0.002)


@pytest.fixture
def storage_path(tmp_path):
    return str(tmp_path / "runs")
