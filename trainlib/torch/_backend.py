"""The torch worker backend: threads, device, and the process group. Runs in worker actors only."""

from __future__ import annotations

import datetime
import os

from trainlib._internal.execution.spec import WorkerInfo
from trainlib._internal.execution.worker import WorkerBackend
from trainlib.torch.config import TorchConfig


class TorchBackend(WorkerBackend):
    def __init__(self, config: TorchConfig, use_gpu: bool):
        self.config = config
        self.use_gpu = use_gpu
        self.device = None

    def on_actor_start(self, num_cpus: float) -> None:
        import torch  # the expensive import happens while the driver is still preparing

        # As torchrun: one intra-op thread per CPU the worker holds, so workers don't oversubscribe.
        torch.set_num_threads(max(1, int(num_cpus)))

    def on_start(self, info: WorkerInfo, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        self.device = _select_device(self.use_gpu)
        backend = self.config.backend or ("nccl" if self.device.type == "cuda" else "gloo")
        if info.world_size > 1:
            kwargs = {}
            if backend == "nccl":
                kwargs["device_id"] = self.device
            dist.init_process_group(
                backend=backend, init_method=f"tcp://{master_addr}:{master_port}", rank=info.world_rank,
                world_size=info.world_size, timeout=datetime.timedelta(seconds=self.config.timeout_s), **kwargs,
            )
        os.environ["TRAINLIB_DEVICE"] = str(self.device)

    def on_shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _select_device(use_gpu: bool):
    import torch

    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "ScalingConfig(use_gpu=True) but torch sees no CUDA device in this worker "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda}): install a CUDA build of torch on the GPU nodes, or set use_gpu=False."
        )
    index = int(os.environ.get("TRAINLIB_GPU_INDEX") or 0)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
