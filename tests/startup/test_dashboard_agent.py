"""The stand-in a lean local Ray node's raylet runs in place of the dashboard agent (dashboard_agent.py)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time

import psutil
from conftest import process_gone

from trainlib._internal.startup import dashboard_agent


def test_the_raylet_is_given_the_stand_in_for_the_dashboard_agent_only():
    command = [
        "raylet",
        "--dashboard_agent_command=/usr/bin/python -u /ray/dashboard/agent.py --head",
        "--runtime_env_agent_command=/usr/bin/python -u /ray/runtime_env/agent/main.py",
        "--x=1",
    ]
    edited = dashboard_agent.with_stand_in(command)
    assert edited[0] == "raylet" and edited[2:] == command[2:]
    flag, value = edited[1].split("=", 1)
    assert flag == "--dashboard_agent_command"
    # The raylet splits the value as a command line: it runs the stand-in by path, isolated.
    assert shlex.split(value) == [sys.executable, "-I", "-S", dashboard_agent.STAND_IN]


def wait_for_signal_handlers(pid: int, timeout: float = 30.0) -> None:
    """Wait until the stand-in has set its handlers: SIGTERM caught, SIGINT ignored.

    A sleep is not enough: on a loaded machine the interpreter's start can take seconds, and a
    signal sent before then takes the default action (CI saw exit -15 after a 0.5 s sleep).
    """

    def mask(name: str) -> int:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith(name + ":"))
        return int(line.split()[1], 16)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mask("SigCgt") >> (signal.SIGTERM - 1) & 1 and mask("SigIgn") >> (signal.SIGINT - 1) & 1:
            return
        time.sleep(0.02)
    raise AssertionError(f"the stand-in (pid {pid}) set no signal handlers within {timeout} s")


# The raylet starts the stand-in; here a throwaway parent process plays the raylet.
PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([*sys.argv[1:], "--agent-args-the-raylet-appends"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_the_stand_in_lives_as_long_as_its_raylet_and_ignores_ctrl_c():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *dashboard_agent.stand_in_command()], stdout=subprocess.PIPE, text=True
    )
    try:
        stand_in = psutil.Process(int(parent.stdout.readline()))
        wait_for_signal_handlers(stand_in.pid)
        stand_in.send_signal(signal.SIGINT)  # Ctrl-C reaches the whole process group: the driver handles it
        time.sleep(1.5)
        assert stand_in.is_running() and stand_in.status() != psutil.STATUS_ZOMBIE
        parent.kill()  # the raylet dies without stopping its agents
        assert process_gone(stand_in, timeout=5), "the stand-in outlived its raylet"
    finally:
        parent.kill()
        parent.wait()


def test_the_stand_in_stops_at_once_when_the_raylet_stops_it():
    stand_in = subprocess.Popen(dashboard_agent.stand_in_command())
    wait_for_signal_handlers(stand_in.pid)
    stand_in.terminate()  # what the raylet sends its agents at shutdown
    assert stand_in.wait(timeout=5) == 0  # exit code 0: an agent's normal stop, not a failure
