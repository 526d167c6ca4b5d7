"""A worker that dies while the group starts is named with its pid and node from Ray's own error; a node whose
Python lacks trainlib is named with the fix."""

from __future__ import annotations

import pytest

from trainlib._internal.execution.failures import death_cause

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_death_before_placement_names_the_pid_and_node_from_rays_error(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class NodeWithoutTrainlib:
        """What a node whose Python has Ray and torch but not trainlib does when the worker actor starts."""

        def __init__(self):
            raise ModuleNotFoundError("No module named 'trainlib'")

        def ping(self):
            return 1

    actor = NodeWithoutTrainlib.remote()
    with pytest.raises(ray.exceptions.RayActorError) as info:
        ray.get(actor.ping.remote(), timeout=60)
    cause = death_cause(str(info.value), None, None)
    assert "pid None" not in cause and "node None" not in cause, cause
    assert f"node {ray.util.get_node_ip_address()}" in cause and "pid " in cause, cause
    assert "cannot import 'trainlib'" in cause and "pip install" in cause, cause
    killed = death_cause(
        "The actor died unexpectedly (pid=4242, ip=10.0.0.7) Worker exit type: SYSTEM_ERROR", None, None
    )
    assert "(pid 4242) on node 10.0.0.7" in killed, killed
