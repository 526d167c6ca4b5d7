"""A lean local Ray node starts its runtime-env agent on the first request for it, not with the node. Driver only.

Each raylet starts a runtime-env agent, a Python process (aiohttp, gRPC, Ray's runtime-env plugins)
that sets up the environment of a task or actor that asks for one (``runtime_env``: pip, conda,
``working_dir``, ``env_vars``...). A trainlib run on its embedded Ray asks for none, nor does the
pipeline's local Ray (its workers inherit their environment; ``flows/task_runner.py``), and the raylet
never calls the agent for a worker without one. Yet the agent's start costs ~0.55 CPU-seconds and
memory, on the cores where the workers are importing torch (docs/benchmarks.md, "Start-up and memory (kept)").

So the raylet runs :data:`ON_DEMAND` with the agent's command. It listens on the agent's port (given to
the raylet, ``agent_ports.py``) and starts the agent at the first connection, then forwards every
connection to it. A user's task with a ``runtime_env`` on the embedded Ray still gets one: its first
request waits for the agent's start (~1-2 s), which any runtime env's setup takes anyway.

A Ray that trainlib did not start is never changed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

AGENT_COMMAND_FLAG = "--runtime_env_agent_command="
ON_DEMAND = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_env_agent_on_demand.py")


def on_demand_command(agent_command: list[str]) -> list[str]:
    """The command that starts ``agent_command`` on the first request: by path, isolated, no site packages."""
    return [sys.executable, "-I", "-S", ON_DEMAND, *agent_command]


def with_agent_on_demand(raylet_command: list[str]) -> list[str]:
    """The raylet's command line, with its runtime-env agent started on demand."""
    edited = []
    for arg in raylet_command:
        if arg.startswith(AGENT_COMMAND_FLAG) and ON_DEMAND not in arg:
            # Ray writes the value with list2cmdline and the raylet splits it as a POSIX shell would.
            agent = shlex.split(arg[len(AGENT_COMMAND_FLAG) :])
            arg = AGENT_COMMAND_FLAG + subprocess.list2cmdline(on_demand_command(agent))
        edited.append(arg)
    return edited
