"""The runtime-env agent of a lean local Ray node starts on the first request for it (runtime_env_agent.py).

Ray's own agent is started on demand in tests/core/test_embedded_ray.py; here a small HTTP server plays
the agent, and a throwaway parent process plays the raylet, to check each way the three can end.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from conftest import free_port, process_gone

from trainlib._internal.startup import runtime_env_agent

# Serves its pid, the parent it was told to watch and the request's body, on the port it is given.
FAKE_AGENT = r"""
import http.server, json, os, sys
args = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
if "--fail" in sys.argv:
    sys.exit(3)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = json.dumps({"pid": os.getpid(), "raylet_pid": os.environ.get("RAY_RAYLET_PID"),
                            "port": int(args["--runtime-env-agent-port"]), "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_):
        pass

server = http.server.ThreadingHTTPServer((args["--node-ip-address"], int(args["--runtime-env-agent-port"])), Handler)
server.serve_forever()
"""

# The raylet starts its agent and prints nothing else; here it prints the agent's pid and sleeps.
PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen(sys.argv[1:])
print(child.pid, flush=True)
time.sleep(600)
"""


def _agent_command(tmp_path, port: int, *extra: str) -> list[str]:
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    return [sys.executable, str(script), "--node-ip-address=127.0.0.1", f"--runtime-env-agent-port={port}", *extra]


def _post(port: int, body: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/get_or_create_runtime_env", data=body.encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _wait_listening(pid: int, port: int, timeout: float = 30) -> None:
    """Until ``pid`` listens on ``port`` (seen from outside: a connection would start the agent)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == port
            for c in psutil.Process(pid).net_connections(kind="tcp")
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"{pid} does not listen on {port}")


def test_the_raylet_is_given_the_agent_on_demand_with_the_agents_own_command():
    agent = [
        "/usr/bin/python",
        "-u",
        "/ray dir/runtime_env/agent/main.py",
        "--node-ip-address=127.0.0.1",
        "--runtime-env-agent-port=5555",
    ]
    command = [
        "raylet",
        "--dashboard_agent_command=/usr/bin/python -u /ray/dashboard/agent.py",
        "--runtime_env_agent_command=" + subprocess.list2cmdline(agent),
        "--x=1",
    ]
    edited = runtime_env_agent.with_agent_on_demand(command)
    assert edited[:2] == command[:2] and edited[3:] == command[3:]
    flag, value = edited[2].split("=", 1)
    assert flag == "--runtime_env_agent_command"
    # The raylet splits the value as a command line: the forwarder by path, isolated, then the agent's own
    # command, word for word (a path with a space included).
    assert shlex.split(value) == [sys.executable, "-I", "-S", runtime_env_agent.ON_DEMAND, *agent]
    assert runtime_env_agent.with_agent_on_demand(edited) == edited  # applied once only


def test_the_agent_starts_at_the_first_request_and_serves_every_one_after_it(tmp_path):
    port = free_port()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *runtime_env_agent.on_demand_command(_agent_command(tmp_path, port))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        forwarder = psutil.Process(int(parent.stdout.readline()))
        _wait_listening(forwarder.pid, port)
        time.sleep(0.5)
        assert forwarder.children() == []  # no request yet: no agent
        first = _post(port, "one")
        second = _post(port, "two" * 50_000)  # 150 kB each way: forwarded whole
        assert first["body"] == "one" and second["body"] == "two" * 50_000
        fds = forwarder.num_fds()
        for index in range(20):  # the raylet asks once per worker with a runtime env, for the node's lifetime
            assert _post(port, str(index))["body"] == str(index)
        time.sleep(0.5)
        assert forwarder.num_fds() <= fds + 1  # each connection's sockets were closed with it
        agents = forwarder.children()
        assert [agent.pid for agent in agents] == [first["pid"]] == [second["pid"]]  # one agent, started once
        assert first["port"] != port  # the agent listens on a port of its own, behind the forwarder
        # The agent watches its parent as it would the raylet: the forwarder, which watches the raylet.
        assert first["raylet_pid"] == str(forwarder.pid)
        forwarder.send_signal(signal.SIGINT)  # Ctrl-C reaches the whole process group: the driver handles it
        time.sleep(1.0)
        assert forwarder.is_running() and forwarder.status() != psutil.STATUS_ZOMBIE
        parent.kill()  # the raylet dies without stopping its agents
        assert process_gone(forwarder, timeout=10), "the forwarder outlived its raylet"
        assert process_gone(agents[0], timeout=10), "the agent outlived the forwarder"
    finally:
        parent.kill()
        parent.wait()


def test_a_stop_from_the_raylet_stops_the_agent_too(tmp_path):
    port = free_port()
    forwarder = subprocess.Popen(runtime_env_agent.on_demand_command(_agent_command(tmp_path, port)))
    try:
        _wait_listening(forwarder.pid, port)
        agent = psutil.Process(_post(port, "x")["pid"])
        forwarder.terminate()  # what the raylet sends its agents at shutdown
        assert forwarder.wait(timeout=10) == 0  # an agent's normal stop, not a failure
        assert process_gone(agent, timeout=10)
    finally:
        forwarder.kill()


def test_an_agent_that_fails_takes_the_forwarder_down_with_its_status(tmp_path):
    port = free_port()
    forwarder = subprocess.Popen(runtime_env_agent.on_demand_command(_agent_command(tmp_path, port, "--fail")))
    try:
        _wait_listening(forwarder.pid, port)
        with pytest.raises(OSError):  # the connection is closed, not left waiting
            _post(port, "x")
        # The raylet sees its agent fail, as it would without the forwarder.
        assert forwarder.wait(timeout=10) == 3
    finally:
        forwarder.kill()
