"""The torch worker backend: threads, device, and the process group. Runs in worker actors only."""

from __future__ import annotations

import datetime
import os
from typing import Any

from trainlib._internal.execution.spec import WorkerInfo
from trainlib._internal.execution.worker import WorkerBackend
from trainlib._internal.startup.allocator import keep_step_allocations
from trainlib._internal.startup.worker_preload import TORCH_MODULES
from trainlib.torch._process_group import init_process_group, open_store
from trainlib.torch.config import TorchConfig


class TorchBackend(WorkerBackend):
    preload_modules = TORCH_MODULES

    def __init__(self, config: TorchConfig, use_gpu: bool):
        self.config = config
        self.use_gpu = use_gpu
        self._store: Any = None  # rank 0's store, open from open_rendezvous until the group is formed

    def on_actor_start(self, num_cpus: float) -> None:
        import torch  # the expensive import happens while the driver is still preparing

        # As torchrun: one intra-op thread per CPU the worker holds, so workers don't oversubscribe; or as many as
        # the user's worker_runtime_env sets in OMP_NUM_THREADS (trainlib sets it to that count otherwise).
        torch.set_num_threads(_threads(os.environ.get("OMP_NUM_THREADS"), max(1, int(num_cpus))))
        # Unlike torchrun: a step's tensors are not handed back to the kernel and faulted in again each step.
        keep_step_allocations()

    def open_rendezvous(self, host: str, world_size: int) -> int:
        """Rank 0's store, listening from now on: ranks that are ready first find it up (``_process_group``)."""
        if world_size < 2:  # no process group: nothing to listen for
            return super().open_rendezvous(host, world_size)
        self._store = open_store(host, world_size, datetime.timedelta(seconds=self.config.timeout_s))
        return self._store.port

    def on_start(self, info: WorkerInfo) -> Any:
        """Pick this worker's device and join the process group; return the device (kept on the session)."""
        from trainlib.torch import amp

        # AMP settings are per process: a second fit() in local mode (or a reused process) starts clean.
        amp.reset()
        store, self._store = self._store, None  # the group keeps it; a restart opens a new one
        device = select_device(self.use_gpu, info.gpu_index)
        if info.world_size > 1:
            init_process_group(
                **process_group_args(self.config, info, device), store=store if info.world_rank == 0 else None
            )
        return device

    def on_shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _threads(omp_num_threads: str | None, default: int) -> int:
    try:
        return max(1, int(omp_num_threads)) if omp_num_threads else default
    except ValueError:
        return default


def process_group_args(config: TorchConfig, info: WorkerInfo, device: Any) -> dict[str, Any]:
    """The arguments of :func:`trainlib.torch._process_group.init_process_group` for this worker."""
    backend = config.backend or ("nccl" if device.type == "cuda" else "gloo")
    args: dict[str, Any] = {
        "backend": backend,
        "master_addr": info.master_addr,
        "master_port": info.master_port,
        "rank": info.world_rank,
        "world_size": info.world_size,
        "timeout": datetime.timedelta(seconds=config.timeout_s),
    }
    if backend == "nccl":
        args["device_id"] = device  # binds the communicator to this worker's GPU at once
    return args


def select_device(use_gpu: bool, gpu_index: int | None):
    """The CPU, or (``use_gpu``) the GPU Ray gave this worker, made the current CUDA device."""
    import torch

    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "ScalingConfig(use_gpu=True) but torch sees no CUDA device in this worker "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda}): install a CUDA build of torch on the GPU nodes, or set use_gpu=False."
        )
    index = gpu_index or 0
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
