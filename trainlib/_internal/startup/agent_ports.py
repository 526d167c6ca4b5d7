"""The ports of a local Ray node's agents, given to its raylet so that it need not wait for them. Driver only.

A raylet starts two Python agents (the dashboard agent: metrics and the node's HTTP API; the
runtime-env agent) and, for each of their ports it was not given, waits until the agent has bound
one and written it to a file. The dashboard agent writes its HTTP port last, after importing its
modules, well after its start, and until then the raylet neither
registers the node nor starts a worker. Given the ports, the raylet registers at once and its
workers import torch while the runtime-env agent starts. What needs an agent retries until it
answers, as after an agent restart: a runtime env's setup.

Given every port, the raylet also runs a stand-in in place of the dashboard agent
(``dashboard_agent.py``): nothing would write that agent's ports, which is why the two go together.
And it starts the runtime-env agent only when a runtime env is first asked for
(``runtime_env_agent.py``): what listens on that agent's port from the start is a forwarder.

Each port is reserved, not only picked: a socket of this process stays bound to it (SO_REUSEADDR,
never listening) until the node is shut down. Meanwhile the kernel gives the port to no other
``bind(0)`` nor outgoing connection on the machine, while the agent, which binds with SO_REUSEADDR
as every server in Ray does, listens on it. Picking a free port and closing it would race with
every process starting a server meanwhile: that is why Ray lets its agents pick.

Ray's ``Node.start_raylet`` and ``services.start_ray_process`` (private) are replaced for the
block; with a Ray whose raylet lacks the flag for the HTTP port, Ray's own start is kept (and its
dashboard agent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import mmap
import socket
from collections.abc import Callable, Iterator
from typing import Any

from trainlib._internal.startup.adapter import replaced_attribute
from trainlib._internal.startup.dashboard_agent import with_stand_in
from trainlib._internal.startup.runtime_env_agent import with_agent_on_demand

logger = logging.getLogger("trainlib")

# Every port a raylet waits for an agent to write when it is not given it, but the metrics agent's (below). The
# dashboard agent's are given too, for its stand-in never writes them.
AGENT_PORTS = ("runtime_env_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
# The metrics agent's gRPC port is given as -1, what Ray's "minimal" agent writes: no metrics agent. The raylet,
# the GCS and every worker then say so once, in their log files. Given a port where nothing answers, each of them
# retried it for 30 s and then printed an ERROR on the user's console ("Failed to establish connection to the
# metrics exporter agent"), in every run longer than that.
NO_METRICS_AGENT_PORT = -1
# Ray passes every other port to the raylet; this one it leaves for the raylet to read from the agent's file.
LISTEN_PORT_FLAG = "--dashboard_agent_listen_port"


@dataclasses.dataclass
class ReservedAgentPorts:
    """The agent ports this process holds for a node (Ray's parameter name -> port), until :meth:`release`."""

    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    _sockets: list[socket.socket] = dataclasses.field(default_factory=list, repr=False)

    def reserve(self, name: str) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", 0))  # every interface: whichever address the agent binds, the port is taken
        self._sockets.append(sock)
        self.ports[name] = sock.getsockname()[1]
        return self.ports[name]

    def release(self) -> None:
        """Close the reserving sockets (the agents' own sockets are not touched)."""
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()


@contextlib.contextmanager
def agent_ports_given_to_raylet() -> Iterator[ReservedAgentPorts]:
    """Inside the block, a local Ray node's raylet is given its agents' ports (reserved here) instead of waiting for them.

    The caller releases the reservation when the node is shut down (or at once if none started).
    Not thread-safe against another thread starting a Ray node in the same process.
    """
    reserved = ReservedAgentPorts()
    try:
        from ray._private import services
        from ray._private.node import Node
    except ImportError:
        yield reserved
        return
    if not _raylet_has_flag(services.RAYLET_EXECUTABLE, LISTEN_PORT_FLAG):
        yield reserved
        return

    def wrap(original: Callable[..., None]) -> Callable[..., None]:
        def start_raylet(self: Any, *args: Any, **kwargs: Any) -> None:
            params = self._ray_params
            for name in AGENT_PORTS:
                if not getattr(params, name, None):  # 0 or None: Ray would let the agent pick
                    setattr(params, name, reserved.reserve(name))
            if not params.metrics_agent_port:
                params.metrics_agent_port = NO_METRICS_AGENT_PORT
            flags = [f"{LISTEN_PORT_FLAG}={params.dashboard_agent_listen_port}"]
            with replaced_attribute(
                services, "start_ray_process", lambda start: functools.partial(_start_with_flags, start, flags)
            ):
                original(self, *args, **kwargs)

        return start_raylet

    with replaced_attribute(Node, "start_raylet", wrap):
        yield reserved


def _start_with_flags(
    start: Callable[..., Any], flags: list[str], command: list[str], process_type: str, *args: Any, **kwargs: Any
) -> Any:
    """Ray's ``start_ray_process``, with ``flags`` added to the raylet's command line, the dashboard agent's
    stand-in and the runtime-env agent started on demand."""
    if process_type == "raylet":
        if not any(arg.startswith(LISTEN_PORT_FLAG) for arg in command):
            command = [*command, *flags]
        command = with_agent_on_demand(with_stand_in(command))
    return start(command, process_type, *args, **kwargs)


@functools.cache
def _raylet_has_flag(raylet_path: str, flag: str) -> bool:
    """Whether the raylet binary defines ``flag`` (its gflags names are in its string table): an unknown flag is fatal."""
    try:
        with open(raylet_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as binary:
            return binary.find(flag.lstrip("-").encode() + b"\0") >= 0
    except (OSError, ValueError) as exc:
        logger.debug("Cannot read the raylet binary %s (%s); its agents pick their ports", raylet_path, exc)
        return False
