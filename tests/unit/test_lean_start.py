"""The lean start of a local Ray node (embedded_ray.without_unused_daemons), the parts testable without a node."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys

from conftest import REPO_ROOT

from trainlib._internal.execution import embedded_ray


def test_the_dashboard_dependency_check_agrees_with_rays_without_importing_them():
    from ray._private.utils import get_dashboard_dependency_error

    # In a fresh process: nothing imported it before, so what is imported after the check, the check did.
    probe = ("import sys; from trainlib._internal.execution.embedded_ray import dashboard_dependency_error as c; "
             "print(c(), sorted(m for m in ('aiohttp', 'opentelemetry', 'grpc', 'prometheus_client', 'pydantic') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert out.stdout.split() == ["None", "[]"], out.stdout + out.stderr
    assert get_dashboard_dependency_error() is None  # Ray's own check (it imports them) says the same


def test_a_missing_dashboard_dependency_is_named(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real_find_spec(name, *a))
    error = embedded_ray.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "prometheus_client"


def test_a_missing_submodule_of_a_namespace_package_is_named(monkeypatch):
    # opentelemetry is a namespace package: its exporter is a distribution of its own, which may be missing.
    real_find_spec = importlib.machinery.PathFinder.find_spec
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec",
                        lambda name, path=None, *a: None if name == "prometheus" else real_find_spec(name, path, *a))
    error = embedded_ray.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "opentelemetry.exporter.prometheus"


def test_rays_start_steps_are_replaced_only_inside_the_block():
    from ray._private import utils as ray_utils
    from ray._private.node import Node

    originals = (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error)
    with embedded_ray.without_unused_daemons():
        assert ray_utils.get_dashboard_dependency_error is embedded_ray.dashboard_dependency_error
        assert Node.start_monitor is not originals[1] and Node.start_api_server is not originals[0]
    assert (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error) == originals
