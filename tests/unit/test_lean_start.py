"""The lean start of a local Ray node (embedded_ray.without_unused_daemons), the parts testable without a node."""

from __future__ import annotations

import importlib.util
import sys

from trainlib._internal.execution import embedded_ray


def test_the_dashboard_dependency_check_agrees_with_rays_without_importing_them():
    from ray._private.utils import get_dashboard_dependency_error

    assert embedded_ray.dashboard_dependency_error() is None
    if "aiohttp" not in sys.modules:  # this process did not import them yet: the check must not either
        assert embedded_ray.dashboard_dependency_error() is None and "aiohttp" not in sys.modules
    assert get_dashboard_dependency_error() is None  # Ray's own check (it imports them) says the same


def test_a_missing_dashboard_dependency_is_named(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real_find_spec(name, *a))
    error = embedded_ray.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "prometheus_client"


def test_rays_start_steps_are_replaced_only_inside_the_block():
    from ray._private import utils as ray_utils
    from ray._private.node import Node

    originals = (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error)
    with embedded_ray.without_unused_daemons():
        assert ray_utils.get_dashboard_dependency_error is embedded_ray.dashboard_dependency_error
        assert Node.start_monitor is not originals[1] and Node.start_api_server is not originals[0]
    assert (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error) == originals
