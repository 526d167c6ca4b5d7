"""Fully sharded data parallelism for ``prepare_model(parallel_strategy="fsdp")``. Runs in worker actors only.

trainlib shards with PyTorch's ``fully_shard`` (FSDP2): it runs on CPUs with
gloo as well as on GPUs, and its parameters are ``DTensor`` shards that
``torch.distributed.checkpoint`` saves per rank (sharded) or gathers into one
state dict (``get_model_state_dict(..., StateDictOptions(full_state_dict=True))``).
Ray Train wraps in the older ``FullyShardedDataParallel`` (FSDP1), which needs
GPUs; a program that passes FSDP1 keyword arguments (``sharding_strategy``,
``auto_wrap_policy``, ...) gets FSDP1 here too, so it runs unchanged on GPUs.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def _parameters(func: Any) -> set[str]:
    return set(inspect.signature(func).parameters) - {"self", "module"}


def shard_model(model: torch.nn.Module, device: torch.device, kwargs: dict[str, Any]) -> torch.nn.Module:
    """Shard ``model`` across the process group: FSDP2 ``fully_shard``, or FSDP1 when given FSDP1 arguments."""
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    fsdp2_args = _parameters(fully_shard)
    fsdp1_args = _parameters(FullyShardedDataParallel.__init__)
    unknown = set(kwargs) - fsdp2_args - fsdp1_args
    if unknown:
        raise TypeError(
            f"prepare_model(parallel_strategy='fsdp', parallel_strategy_kwargs=...) got {sorted(unknown)}, which "
            f"neither torch.distributed.fsdp.fully_shard ({sorted(fsdp2_args)}) nor FullyShardedDataParallel "
            "takes: fix or drop them."
        )
    if set(kwargs) - fsdp2_args:  # FSDP1-only arguments: the user wrote for FullyShardedDataParallel
        if device.type == "cpu":
            raise RuntimeError(
                f"parallel_strategy_kwargs {sorted(set(kwargs) - fsdp2_args)} are FullyShardedDataParallel "
                "(FSDP1) arguments, and FSDP1 needs GPUs: set ScalingConfig(use_gpu=True), or pass "
                f"fully_shard (FSDP2) arguments ({sorted(fsdp2_args)}), which also run on CPUs."
            )
        kwargs = {"device_id": device, **kwargs}
        return FullyShardedDataParallel(model, **kwargs)
    fully_shard(model, **kwargs)
    return model
