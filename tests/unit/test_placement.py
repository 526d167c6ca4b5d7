"""Rank layout, GPU visibility and the resource check, without a cluster."""

from __future__ import annotations

import pytest

import trainlib
from trainlib._internal.execution.placement import check_resources, plan_ranks
from trainlib._internal.execution.spec import Placement


def _placement(node: str, ip: str, gpus=()):
    return Placement(node_id=node, node_ip=ip, hostname=node, pid=1, gpu_ids=tuple(gpus))


def test_ranks_are_contiguous_per_node_with_torchrun_environment():
    placements = [
        _placement("a", "10.0.0.1"),
        _placement("b", "10.0.0.2"),
        _placement("a", "10.0.0.1"),
        _placement("b", "10.0.0.2"),
    ]
    plan = plan_ranks(placements, master_port=29500)
    assert plan.order == [0, 2, 1, 3]
    assert [(i.world_rank, i.local_rank, i.node_rank) for i in plan.infos] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    assert plan.num_nodes == 2
    env = plan.envs[2]
    assert env["RANK"] == "2" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "0"
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
    assert (plan.infos[2].master_addr, plan.infos[2].master_port) == ("10.0.0.1", 29500)
    assert "CUDA_VISIBLE_DEVICES" not in env and plan.infos[2].gpu_index is None


def test_gpu_workers_see_their_node_gpus_and_pick_their_own():
    # Ray gave GPU 3 to the first actor and GPU 1 to the second, on one node.
    placements = [
        _placement("a", "10.0.0.1", ["3"]),
        _placement("a", "10.0.0.1", ["1"]),
        _placement("b", "10.0.0.2", ["0"]),
    ]
    plan = plan_ranks(placements, master_port=1)
    assert plan.envs[0]["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert plan.infos[0].gpu_index == 1  # GPU 3 is the second visible device
    assert plan.infos[1].gpu_index == 0
    assert plan.envs[2]["CUDA_VISIBLE_DEVICES"] == "0" and plan.infos[2].gpu_index == 0


def _node(cpu, gpu=0, alive=True):
    resources = {"CPU": cpu, "memory": 1e9, "node:10.0.0.1": 1.0}
    if gpu:
        resources["GPU"] = gpu
    return {"Alive": alive, "Resources": resources}


def test_resource_check_accepts_what_fits():
    check_resources(trainlib.ScalingConfig(num_workers=4), [_node(2), _node(2)])
    check_resources(trainlib.ScalingConfig(num_workers=2, use_gpu=True), [_node(8, gpu=2)])


@pytest.mark.parametrize(
    "scaling, nodes, words",
    [
        (
            trainlib.ScalingConfig(num_workers=1, use_gpu=True),
            [_node(8)],
            ["{CPU: 1, GPU: 1}", "no node", "use_gpu=False"],
        ),
        (trainlib.ScalingConfig(num_workers=5), [_node(2), _node(2)], ["5 workers", "at most 4"]),
        (trainlib.ScalingConfig(num_workers=3, placement_strategy="STRICT_PACK"), [_node(2), _node(2)], ["at most 2"]),
        (
            trainlib.ScalingConfig(num_workers=3, placement_strategy="STRICT_SPREAD"),
            [_node(4), _node(4)],
            ["at most 2"],
        ),
        (trainlib.ScalingConfig(num_workers=3), [_node(2), _node(64, alive=False)], ["over 1 node(s)", "at most 2"]),
    ],
)
def test_resource_check_rejects_what_never_fits(scaling, nodes, words):
    with pytest.raises(trainlib.ResourcesUnavailableError) as info:
        check_resources(scaling, nodes)
    for word in words:
        assert word in str(info.value)


def test_accelerator_type_asks_for_rays_accelerator_resource_and_only_its_nodes_fit():
    scaling = trainlib.ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")
    assert scaling.worker_resources == {"CPU": 1.0, "GPU": 1.0, "accelerator_type:A100": 0.001}
    a100 = _node(8, gpu=2)
    a100["Resources"]["accelerator_type:A100"] = 1.0
    check_resources(scaling, [a100])
    h100 = _node(8, gpu=8)
    h100["Resources"]["accelerator_type:H100"] = 1.0
    with pytest.raises(trainlib.ResourcesUnavailableError) as info:
        check_resources(scaling, [h100])
    message = str(info.value)
    assert "{CPU: 1, GPU: 1, accelerator_type: A100}" in message  # what each worker asks for
    assert "accelerator_type: H100" in message and "drop accelerator_type='A100'" in message
    with pytest.raises(TypeError, match="accelerator_type must be an accelerator's name"):
        trainlib.ScalingConfig(accelerator_type="")


def test_ray_trains_per_worker_resource_properties():
    scaling = trainlib.ScalingConfig(
        num_workers=2, use_gpu=True, resources_per_worker={"CPU": 4, "GPU": 1, "ssd": 1}, accelerator_type="H100"
    )
    assert (scaling.num_cpus_per_worker, scaling.num_gpus_per_worker) == (4.0, 1.0)
    assert scaling.additional_resources_per_worker == {"ssd": 1.0, "accelerator_type:H100": 0.001}
    assert scaling.total_resources["CPU"] == 8.0
