"""Run by a lean local Ray node's raylet in place of its runtime-env agent: starts the agent on the first request.

    python -I -S runtime_env_agent_on_demand.py AGENT_COMMAND...

It listens on the agent's port (``--runtime-env-agent-port``, given to the raylet by ``agent_ports.py``).
On the first connection it starts the agent's own command on a private port, then forwards every
connection there, byte for byte (HTTP with Ray's token: nothing is read). A run that uses no runtime
env never starts the agent (``runtime_env_agent.py`` says why). The agent is this process's child and
is told so (``RAY_RAYLET_PID``), so each watches the other as the agent would watch the raylet: this
process leaves when the raylet dies or stops it (SIGTERM, passed on to the agent), and when the agent
exits (with its status, so the raylet sees its agent fail as it would without this process).

Run by path with ``python -I -S``: standard library only, never imports trainlib.
"""

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PORT_FLAG = "--runtime-env-agent-port="
HOST_FLAG = "--node-ip-address="
POLL_S = 1.0  # as often as Ray's own agents look for their raylet
CONNECT_TIMEOUT_S = 120.0  # the agent's start, on a loaded machine, before a forwarded connection gives up
CHUNK = 1 << 16


def flag_value(command, flag):
    for arg in command:
        if arg.startswith(flag):
            return arg[len(flag) :]
    raise SystemExit(f"runtime_env_agent_on_demand: the agent's command has no {flag}...: {command}")


def bound_socket(host, port):
    """A TCP socket bound to ``host``'s ``port`` (0: one the system picks) with SO_REUSEADDR, as the agent binds."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    return sock


def pump(source, sink):
    """Copy ``source`` to ``sink`` until ``source`` ends or either fails; then pass the end on to ``sink``."""
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Agent:
    """The real agent, started once, on a private port."""

    def __init__(self, command, host):
        self.command, self.host = command, host
        self.process = None
        self.port = None
        self._reserved = None
        self._lock = threading.Lock()

    def start(self):
        with self._lock:
            if self.process is not None:
                return
            # Held by a bound, never listening socket until we exit: the agent binds it too (SO_REUSEADDR),
            # and meanwhile no other process on the machine is given it.
            self._reserved = bound_socket(self.host, 0)
            self.port = self._reserved.getsockname()[1]
            command = [f"{PORT_FLAG}{self.port}" if arg.startswith(PORT_FLAG) else arg for arg in self.command]
            # The agent fate-shares with its parent (Ray's process_watcher): that is this process now.
            env = {**os.environ, "RAY_RAYLET_PID": str(os.getpid())}
            self.process = subprocess.Popen(command, env=env)

    def connect(self):
        """A connection to the agent, once it listens; None if it exited or did not listen in time."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        delay = 0.02
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                return socket.create_connection((self.host, self.port), timeout=POLL_S)
            except OSError:
                time.sleep(delay)
                delay = min(2 * delay, 0.25)
        return None

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()


def forward(client, agent):
    """Carry one connection to the agent and back; close both sides when both ways have ended."""
    upstream = agent.connect()
    if upstream is None:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    upstream.close()
    client.close()


def main():
    command = sys.argv[1:]
    host, port = flag_value(command, HOST_FLAG), int(flag_value(command, PORT_FLAG))
    raylet = os.getppid()
    agent = Agent(command, host)

    def stop(*_):
        agent.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops Ray
    listener = bound_socket(host, port)
    listener.listen(128)
    while os.getppid() == raylet:  # re-parented: the raylet died without stopping us
        if agent.process is not None and agent.process.poll() is not None:
            sys.exit(agent.process.returncode)  # the agent failed: the raylet must see it, as without us
        ready, _, _ = select.select([listener], [], [], POLL_S)
        if ready:
            client, _ = listener.accept()
            agent.start()
            threading.Thread(target=forward, args=(client, agent), daemon=True).start()
    agent.stop()


if __name__ == "__main__":
    main()
