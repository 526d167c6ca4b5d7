"""A flow run ends without waiting for Prefect's heartbeat thread (flows/heartbeats.py), which still stops by itself."""

from __future__ import annotations

import logging
import threading

import pytest


class _Engine:
    """What Prefect's ``_send_heartbeats`` reads of a flow run engine: a run in progress, heartbeats every 30 s."""

    heartbeat_seconds = 30
    flow_run = None
    logger = logging.getLogger("test-heartbeats")

    def __init__(self):
        self.sent = []

    def _build_heartbeat_event_template(self):
        return {"prefect.resource.id": "prefect.flow-run.test"}, []

    def _emit_flow_run_heartbeat(self, resource, related):
        self.sent.append(resource)


def test_importing_the_flows_installs_it_once():
    from prefect import flow_engine

    import flows.pipeline  # noqa: F401 - installs it
    from flows.heartbeats import end_flow_runs_without_joining_heartbeats

    installed = flow_engine._send_heartbeats
    assert installed.__wrapped__.__module__ == "prefect.flow_engine"
    assert end_flow_runs_without_joining_heartbeats() is True
    assert flow_engine._send_heartbeats is installed  # not wrapped twice


def test_the_run_ends_at_once_and_the_thread_stops_after_it_without_another_heartbeat():
    from prefect import flow_engine

    import flows.pipeline  # noqa: F401

    engine = _Engine()
    before = set(threading.enumerate())
    with flow_engine._send_heartbeats(engine):
        (thread,) = set(threading.enumerate()) - before
    # Prefect's own context manager would have joined the thread, asleep in its one-second step, here.
    assert thread.is_alive()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert engine.sent == [{"prefect.resource.id": "prefect.flow-run.test"}]  # the first one only


def test_an_error_in_the_run_passes_through_and_stops_the_thread():
    from prefect import flow_engine

    import flows.pipeline  # noqa: F401

    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="in the flow"):
        with flow_engine._send_heartbeats(_Engine()):
            (thread,) = set(threading.enumerate()) - before
            raise ValueError("in the flow")
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_prefect_without_the_join_option_keeps_its_own(monkeypatch):
    from prefect import flow_engine

    from flows.heartbeats import end_flow_runs_without_joining_heartbeats

    def other_prefect(engine):  # a signature this module does not know
        raise AssertionError("not called")

    monkeypatch.setattr(flow_engine, "_send_heartbeats", other_prefect)
    assert end_flow_runs_without_joining_heartbeats() is False
    assert flow_engine._send_heartbeats is other_prefect
