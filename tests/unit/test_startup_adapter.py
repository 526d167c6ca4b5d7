"""The start-up layer's adapter (trainlib/_internal/startup/adapter.py): checked versions, the switch, one log line."""

from __future__ import annotations

import logging

import pytest
import ray
from ray._private.node import Node

from trainlib._internal.startup import adapter
from trainlib._internal.startup.lean_start import lean_system_config, without_unused_daemons


@pytest.fixture(autouse=True)
def _fresh_reports(monkeypatch):
    monkeypatch.setattr(adapter, "_reported", set())
    monkeypatch.delenv(adapter.LEAN_STARTUP_ENV_VAR, raising=False)


def _replacement(original):
    def replaced(*args, **kwargs):
        return original(*args, **kwargs)

    return replaced


def test_the_installed_versions_are_the_checked_ones():
    import mlflow
    import prefect

    for module in (ray, prefect, mlflow):
        checked = adapter.CHECKED_VERSIONS[module.__name__]
        assert module.__version__.split(".")[:2] == checked.split(".")[:2], (module.__name__, module.__version__)
        assert adapter.version_checked(module.__name__)


def test_the_checked_ray_gets_the_replacement_only_inside_the_block():
    original = Node.start_monitor
    with adapter.replaced_attribute(Node, "start_monitor", _replacement) as replaced:
        assert replaced and Node.start_monitor is not original
    assert Node.start_monitor is original


def test_an_unknown_ray_version_keeps_rays_own_start_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(ray, "__version__", "2.99.0")
    originals = (Node.start_api_server, Node.start_monitor)
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        with adapter.replaced_attribute(Node, "start_monitor", _replacement) as replaced:
            assert not replaced and Node.start_monitor is originals[1]
        with without_unused_daemons():  # the lean start's own replacements: none made either
            assert (Node.start_api_server, Node.start_monitor) == originals
    lines = [r.getMessage() for r in caplog.records if r.name == "trainlib"]
    assert len(lines) == 1, lines
    assert "checked on ray 2.60.0, not 2.99.0" in lines[0] and "keeps its own behaviour" in lines[0]


def test_an_unknown_prefect_version_keeps_its_heartbeats(monkeypatch):
    import prefect
    from prefect import flow_engine

    from flows.heartbeats import end_flow_runs_without_joining_heartbeats, not_joined

    monkeypatch.setattr(prefect, "__version__", "3.99.0")
    stock = getattr(flow_engine._send_heartbeats, "__wrapped__", flow_engine._send_heartbeats)
    monkeypatch.setattr(flow_engine, "_send_heartbeats", stock)
    assert end_flow_runs_without_joining_heartbeats() is False
    assert flow_engine._send_heartbeats is stock
    monkeypatch.setattr(prefect, "__version__", adapter.CHECKED_VERSIONS["prefect"])
    assert adapter.install_attribute(flow_engine, "_send_heartbeats", not_joined)
    assert flow_engine._send_heartbeats.__wrapped__ is stock


@pytest.mark.parametrize("value", ["0", "false", "No", "off"])
def test_the_switch_turns_every_replacement_and_the_lean_config_off(monkeypatch, value):
    monkeypatch.setenv(adapter.LEAN_STARTUP_ENV_VAR, value)
    assert not adapter.lean_startup_enabled()
    original = Node.start_monitor
    with adapter.replaced_attribute(Node, "start_monitor", _replacement) as replaced:
        assert not replaced and Node.start_monitor is original
    assert adapter.install_attribute(Node, "start_monitor", _replacement) is False
    assert lean_system_config(("torch",)) == {}


def test_with_the_switch_unset_the_lean_config_preloads_and_turns_metrics_off():
    config = lean_system_config(("torch",), lazy_serializers=False, idle_worker_killing_time_threshold_ms=5)
    assert config["enable_metrics_collection"] is False and config["idle_worker_killing_time_threshold_ms"] == 5
    assert "torch" in config["preload_python_modules"]
    assert "trainlib._internal.startup.worker_setup" not in config["preload_python_modules"]


def test_an_owner_without_the_attribute_is_left_alone():
    class Owner:
        __module__ = "ray._private.node"

    with adapter.replaced_attribute(Owner, "start_nothing", _replacement) as replaced:
        assert not replaced and not hasattr(Owner, "start_nothing")
