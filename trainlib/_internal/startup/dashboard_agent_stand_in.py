"""Run by a lean local Ray node's raylet in place of Ray's dashboard agent (``dashboard_agent.py``).

It serves nothing: it lives as long as the raylet, as the agent would, because the raylet takes an
agent's exit for a failure and exits too. It leaves when the raylet stops it (SIGTERM) or dies.
Run by path with ``python -I -S``: standard library only, never imports trainlib.
"""

import os
import signal
import sys
import time

PARENT_POLL_S = 1.0  # as often as Ray's own agents look for their raylet


def main() -> None:
    raylet = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops Ray
    while os.getppid() == raylet:  # re-parented: the raylet died without stopping us
        time.sleep(PARENT_POLL_S)


if __name__ == "__main__":
    main()
