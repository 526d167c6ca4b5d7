"""A lean local Ray node runs no dashboard agent. Driver only.

Each Ray node's raylet starts a dashboard agent, a Python process whose modules serve the dashboard
head (logs, jobs, events, node statistics) and export Ray's metrics for Prometheus. A lean node has
no dashboard head (``embedded_ray.py``), so of all that only the metrics export would be left, and
nothing in a trainlib run reads it. The agent's start (gRPC, aiohttp, OpenTelemetry, its modules) takes
CPU and memory on the cores where the workers are importing torch (docs/benchmarks.md, "Start-up and
memory (kept)").

The raylet will not start without an agent command and exits when its agent does, so it is given a
command that starts a stand-in (``dashboard_agent_stand_in.py``) that only lives as long as the
raylet. That goes with the raylet being given every agent port (``agent_ports.py``, which applies
:func:`with_stand_in`): nothing writes the agent's ports to its files, and the raylet would wait for
them. Reserved and never listened on, a connection to them is refused at once; the metrics agent's
port is given as -1 (none), so no process waits for an exporter that is not there. Ray's metrics
collection is off in such a node (:data:`NO_METRICS_SYSTEM_CONFIG`), so none records metrics for it either.

A user who wants the agent (Ray's metrics) starts Ray before ``fit()``: a Ray that trainlib did not
start is never changed.
"""

from __future__ import annotations

import os
import subprocess
import sys

AGENT_COMMAND_FLAG = "--dashboard_agent_command="
STAND_IN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard_agent_stand_in.py")
# For ray.init's _system_config: nothing would export the metrics.
NO_METRICS_SYSTEM_CONFIG = {"enable_metrics_collection": False}  # part of lean_start.LEAN_SYSTEM_CONFIG


def stand_in_command() -> list[str]:
    """The command the raylet runs in place of the dashboard agent: by path, isolated, no site packages."""
    return [sys.executable, "-I", "-S", STAND_IN]


def with_stand_in(raylet_command: list[str]) -> list[str]:
    """The raylet's command line, with its dashboard agent command replaced by the stand-in's."""
    agent = AGENT_COMMAND_FLAG + subprocess.list2cmdline(stand_in_command())
    return [agent if arg.startswith(AGENT_COMMAND_FLAG) else arg for arg in raylet_command]
