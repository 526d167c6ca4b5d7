"""``get_device`` and ``get_devices``: the torch devices of this worker. Runs in worker actors (and plain scripts).

The worker backend picks the devices when the worker starts and records them in
the worker's environment (``TRAINLIB_DEVICE``, ``TRAINLIB_DEVICES``); outside a
worker both functions answer the CPU, so a script can be tried without Ray.
"""

from __future__ import annotations

import os

import torch

DEVICE_ENV = "TRAINLIB_DEVICE"  # this worker's main device, e.g. "cuda:1" or "cpu"
DEVICES_ENV = "TRAINLIB_DEVICES"  # all of this worker's devices, comma-separated


def get_device() -> torch.device:
    """The device this worker trains on: its (first) GPU with ``use_gpu=True``, else the CPU."""
    name = os.environ.get(DEVICE_ENV)
    return torch.device(name) if name else torch.device("cpu")


def get_devices() -> list[torch.device]:
    """Every device of this worker, first one first: several GPUs when ``resources_per_worker`` gives
    each worker more than one (``{"GPU": 2}``), else ``[get_device()]``."""
    names = [n for n in os.environ.get(DEVICES_ENV, "").split(",") if n]
    return [torch.device(n) for n in names] if names else [get_device()]
