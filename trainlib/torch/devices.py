"""``get_device`` and ``get_devices``: the torch devices of this worker. Runs in worker actors (and plain scripts).

The worker backend picks the device when the worker starts and keeps it on the
worker's session; outside a worker both functions answer the CPU, so a script
can be tried without Ray.
"""

from __future__ import annotations

import torch

from trainlib._internal.execution.session import current_session


def get_device() -> torch.device:
    """The device this worker trains on: its (first) GPU with ``use_gpu=True``, else the CPU."""
    s = current_session()
    if s is not None and s.device is not None:
        return s.device
    return torch.device("cpu")


def get_devices() -> list[torch.device]:
    """Every device of this worker, first one first. trainlib gives each worker one device (its GPU, or
    the CPU), so this is ``[get_device()]``; Ray's answer for several GPUs per worker is not built."""
    return [get_device()]
