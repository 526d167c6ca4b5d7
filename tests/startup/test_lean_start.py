"""The lean start of a local Ray node (lean_start.without_unused_daemons), the parts testable without a node."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys

from conftest import REPO_ROOT

from trainlib._internal.startup import lean_start


def test_the_dashboard_dependency_check_agrees_with_rays_without_importing_them():
    from ray._private.utils import get_dashboard_dependency_error

    # In a fresh process: nothing imported it before, so what is imported after the check, the check did.
    probe = (
        "import sys; from trainlib._internal.startup.lean_start import dashboard_dependency_error as c; "
        "print(c(), sorted(m for m in ('aiohttp', 'opentelemetry', 'grpc', 'prometheus_client', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
    )
    assert out.stdout.split() == ["None", "[]"], out.stdout + out.stderr
    assert get_dashboard_dependency_error() is None  # Ray's own check (it imports them) says the same


def test_a_missing_dashboard_dependency_is_named(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "prometheus_client" else real_find_spec(name, *a)
    )
    error = lean_start.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "prometheus_client"


def test_a_missing_submodule_of_a_namespace_package_is_named(monkeypatch):
    # opentelemetry is a namespace package: its exporter is a distribution of its own, which may be missing.
    real_find_spec = importlib.machinery.PathFinder.find_spec
    monkeypatch.setattr(
        importlib.machinery.PathFinder,
        "find_spec",
        lambda name, path=None, *a: None if name == "prometheus" else real_find_spec(name, path, *a),
    )
    error = lean_start.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "opentelemetry.exporter.prometheus"


def test_rays_start_steps_are_replaced_only_inside_the_block():
    from ray._private import utils as ray_utils
    from ray._private.node import Node

    originals = (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error)
    with lean_start.without_unused_daemons():
        assert ray_utils.get_dashboard_dependency_error is lean_start.dashboard_dependency_error
        assert Node.start_monitor is not originals[1] and Node.start_api_server is not originals[0]
    assert (Node.start_api_server, Node.start_monitor, ray_utils.get_dashboard_dependency_error) == originals


def test_a_reserved_agent_port_is_refused_to_others_and_open_to_an_agent_until_released():
    import errno
    import socket

    from trainlib._internal.startup.agent_ports import ReservedAgentPorts

    reserved = ReservedAgentPorts()
    port = reserved.reserve("metrics_agent_port")
    assert reserved.ports == {"metrics_agent_port": port}
    # Another program binding it (no SO_REUSEADDR, as with a kernel-chosen port) is refused meanwhile...
    other = socket.socket()
    try:
        other.bind(("127.0.0.1", port))
        raise AssertionError("the reserved port was given to another socket")
    except OSError as exc:
        assert exc.errno == errno.EADDRINUSE
    finally:
        other.close()
    # ...while an agent's server, which binds with SO_REUSEADDR, listens on it and is reachable.
    agent = socket.socket()
    agent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    agent.bind(("127.0.0.1", port))
    agent.listen()
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    agent.close()
    reserved.release()
    free = socket.socket()
    free.bind(("127.0.0.1", port))  # released: anyone may have it
    free.close()


def test_the_raylet_alone_gets_the_agents_http_port_flag_and_rays_steps_come_back_after_the_block():
    from ray._private import services
    from ray._private.node import Node

    from trainlib._internal.startup import agent_ports

    seen = []

    def start(command, process_type, *args, **kwargs):
        seen.append((process_type, command))

    flags = ["--dashboard_agent_listen_port=5"]
    agent_ports._start_with_flags(start, flags, ["raylet", "--x=1"], "raylet")
    agent_ports._start_with_flags(start, flags, ["gcs_server"], "gcs_server")
    agent_ports._start_with_flags(start, flags, ["raylet", "--dashboard_agent_listen_port=7"], "raylet")
    assert seen == [
        ("raylet", ["raylet", "--x=1", "--dashboard_agent_listen_port=5"]),
        ("gcs_server", ["gcs_server"]),
        ("raylet", ["raylet", "--dashboard_agent_listen_port=7"]),
    ]  # Ray's own value wins
    original = (Node.start_raylet, services.start_ray_process)
    with agent_ports.agent_ports_given_to_raylet() as reserved:
        assert Node.start_raylet is not original[0]
    assert (Node.start_raylet, services.start_ray_process) == original and reserved.ports == {}


def test_every_agent_port_is_reserved_for_the_stand_in_writes_none(monkeypatch):
    import types

    from ray._private import services
    from ray._private import utils as ray_utils
    from ray._private.node import Node

    from trainlib._internal.startup import agent_ports, dashboard_agent

    started = []

    def fake_start_raylet(self):  # stands for Ray's: starts the raylet through start_ray_process
        services.start_ray_process(["raylet", "--dashboard_agent_command=python agent.py"], "raylet")

    monkeypatch.setattr(Node, "start_raylet", fake_start_raylet)
    monkeypatch.setattr(services, "start_ray_process", lambda command, process_type, *a, **k: started.append(command))
    # With the dashboard's dependencies or without ("minimal" Ray, whose agent would write -1 for its ports):
    # the stand-in writes no port file, so the raylet must be given them all, or it would wait for them.
    for dependency_error in (None, ImportError("aiohttp")):
        monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda error=dependency_error: error)
        # Ray's defaults: every port 0 (the agent picks) but the HTTP one, which has a fixed default.
        params = types.SimpleNamespace(
            runtime_env_agent_port=0, metrics_agent_port=0, metrics_export_port=None, dashboard_agent_listen_port=52365
        )
        with agent_ports.agent_ports_given_to_raylet() as reserved:
            Node.start_raylet(types.SimpleNamespace(_ray_params=params))
        assert set(reserved.ports) == {"runtime_env_agent_port", "metrics_export_port"}
        assert all(getattr(params, name) == port for name, port in reserved.ports.items())
        assert params.metrics_agent_port == -1  # no metrics agent: nothing waits for one (agent_ports.py)
        reserved.release()
    stand_in = dashboard_agent.with_stand_in(["--dashboard_agent_command=python agent.py"])
    assert started == [["raylet", *stand_in, "--dashboard_agent_listen_port=52365"]] * 2
