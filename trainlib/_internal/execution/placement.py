"""Placement: does the cluster fit the group, and which actor gets which rank. Driver only."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainlib._internal.execution.spec import Placement, WorkerInfo
from trainlib.errors import ResourcesUnavailableError
from trainlib.scaling import ACCELERATOR_RESOURCE_PREFIX, ScalingConfig


def format_resources(resources: dict[str, float]) -> str:
    """Resources as people read them: Ray's bookkeeping left out, an accelerator as ``accelerator_type: A100``."""
    shown = {
        k: (int(v) if float(v).is_integer() else round(v, 2))
        for k, v in sorted(resources.items())
        if k in ("CPU", "GPU") or not k.startswith(("node:", ACCELERATOR_RESOURCE_PREFIX, "object_store", "memory"))
    }
    accelerators = sorted(
        k[len(ACCELERATOR_RESOURCE_PREFIX) :]
        for k, v in resources.items()
        if k.startswith(ACCELERATOR_RESOURCE_PREFIX) and v
    )
    parts = [f"{k}: {v}" for k, v in shown.items()] + (
        [f"accelerator_type: {', '.join(accelerators)}"] if accelerators else []
    )
    return "{" + ", ".join(parts) + "}"


def workers_that_fit(scaling: ScalingConfig, resources_by_node: list[dict[str, float]]) -> int:
    """How many workers of ``scaling`` these nodes' resources hold, under its placement strategy."""
    per_worker = scaling.worker_resources
    capacity = [
        min(int(math.floor(have.get(k, 0) / v + 1e-9)) for k, v in per_worker.items()) for have in resources_by_node
    ]
    if not capacity:
        return 0
    if scaling.placement_strategy == "STRICT_PACK":
        return max(capacity)
    if scaling.placement_strategy == "STRICT_SPREAD":
        return sum(1 for c in capacity if c)
    return sum(capacity)


def available_workers(scaling: ScalingConfig) -> int:
    """How many workers of ``scaling`` the cluster's free resources hold now (for elastic runs)."""
    import ray

    try:
        from ray._private.state import available_resources_per_node

        free = list(available_resources_per_node().values())
    except (ImportError, AttributeError):  # Ray moved it: take the whole cluster as one node
        free = [ray.available_resources()]
    return workers_that_fit(scaling, free)


def check_resources(scaling: ScalingConfig, nodes: list[dict[str, Any]]) -> None:
    """Fail at once when the cluster's nodes can never hold the worker group (``min_workers`` when elastic)."""
    per_worker = scaling.worker_resources
    alive = [n for n in nodes if n.get("Alive", True)]
    cluster = format_resources(
        {
            k: sum(n.get("Resources", {}).get(k, 0) for n in alive)
            for k in set().union(*(n.get("Resources", {}) for n in alive)) | set(per_worker)
        }
    )
    fix = (
        "lower ScalingConfig.num_workers or resources_per_worker"
        + (", or set use_gpu=False" if scaling.use_gpu else "")
        + (
            f", or drop accelerator_type={scaling.accelerator_type!r} (or name one the cluster has)"
            if scaling.accelerator_type
            else ""
        )
        + ", or connect to a bigger Ray cluster (ray.init(address=...) / RAY_ADDRESS)"
    )
    if not any(workers_that_fit(scaling, [n.get("Resources", {})]) for n in alive):
        raise ResourcesUnavailableError(
            f"Each worker asks for {format_resources(per_worker)}, but no node of the Ray cluster has that much "
            f"(the cluster has {cluster} over {len(alive)} node(s)): {fix}."
        )
    fits = workers_that_fit(scaling, [n.get("Resources", {}) for n in alive])
    if fits < scaling.min_workers:
        asked = scaling.num_workers if not scaling.elasticity_enabled else f"at least {scaling.min_workers}"
        raise ResourcesUnavailableError(
            f"ScalingConfig asks for {asked} workers x {format_resources(per_worker)} "
            f"({scaling.placement_strategy}), but the cluster has {cluster} over {len(alive)} node(s) and "
            f"can hold at most {fits} such workers: {fix}."
        )


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """The rank layout of a started group: ``order[rank]`` is the actor index of that rank."""

    order: list[int]
    infos: list[WorkerInfo]
    envs: list[dict[str, str]]
    node_ips: list[str]
    num_nodes: int


def plan_ranks(placements: list[Placement], master_port: int) -> RankPlan:
    """Give ranks so each node's workers are contiguous; pick each worker's GPU; set torchrun's environment."""
    nodes: list[str] = []
    for p in placements:
        if p.node_id not in nodes:
            nodes.append(p.node_id)
    order = sorted(range(len(placements)), key=lambda i: (nodes.index(placements[i].node_id), i))
    world_size = len(placements)
    master_addr = placements[order[0]].node_ip
    by_node = {n: [i for i in order if placements[i].node_id == n] for n in nodes}
    infos, envs = [], []
    for rank, index in enumerate(order):
        p = placements[index]
        peers = by_node[p.node_id]
        local_rank = peers.index(index)
        node_rank = nodes.index(p.node_id)
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "NODE_RANK": str(node_rank),
            "GROUP_RANK": str(node_rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
        gpu_index = None
        if p.gpu_ids:
            # Every worker of a node sees all the node's group GPUs (nccl needs peer access);
            # each one uses the GPU that Ray gave it.
            node_gpus = sorted({g for i in peers for g in placements[i].gpu_ids}, key=_gpu_sort_key)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus)
            gpu_index = node_gpus.index(p.gpu_ids[0])
        infos.append(
            WorkerInfo(
                world_rank=rank,
                world_size=world_size,
                local_rank=local_rank,
                local_world_size=len(peers),
                node_rank=node_rank,
                master_addr=master_addr,
                master_port=master_port,
                gpu_index=gpu_index,
            )
        )
        envs.append(env)
    return RankPlan(
        order=order, infos=infos, envs=envs, node_ips=[placements[i].node_ip for i in order], num_nodes=len(nodes)
    )


def _gpu_sort_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if gpu_id.isdigit() else (1 << 30, gpu_id)
