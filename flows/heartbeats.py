"""A flow run ends without waiting for its heartbeat thread. Runs in the flow-run process.

Prefect sends a flow run's heartbeats (``flows.heartbeat_frequency``, 180 s by default, for
detecting runs that died with their worker) from a thread that sleeps in one-second steps and
checks a stop flag between them; the synchronous flow engine joins that thread when the run
ends, so every flow run ends up to a step late (each of the pipeline's two flow runs pays it).
Prefect's async engine does not join it. This module makes the
synchronous engine do the same: the thread still stops at its next step and never sends a
heartbeat after the stop flag is set (Prefect checks the flag before each one), it is a daemon
thread, and the run's final state is set by the engine, not by the thread.

Prefect's private ``flow_engine._send_heartbeats`` is replaced when the flows' modules are imported (before
any flow of the project runs), through trainlib's start-up adapter (``trainlib.startup.install_attribute``):
with a Prefect other than the one checked, one that lacks it, or ``TRAINLIB_LEAN_STARTUP=0``, Prefect's own
behaviour stays.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from trainlib.startup import install_attribute

_INSTALLED_MARK = "_trainlib_not_joined"


def not_joined(send_heartbeats: Callable[..., Any]) -> Callable[..., Any]:
    """Prefect's ``_send_heartbeats(engine, join_on_exit=True)`` context manager, always with ``join_on_exit=False``."""

    @contextlib.contextmanager
    def send_heartbeats_not_joined(engine: Any, join_on_exit: bool = True) -> Iterator[None]:
        with send_heartbeats(engine, join_on_exit=False):
            yield

    send_heartbeats_not_joined.__wrapped__ = send_heartbeats  # type: ignore[attr-defined]
    setattr(send_heartbeats_not_joined, _INSTALLED_MARK, True)
    return send_heartbeats_not_joined


def end_flow_runs_without_joining_heartbeats() -> bool:
    """Install :func:`not_joined` in Prefect's flow engine (once); return whether it is installed."""
    try:
        from prefect import flow_engine
    except ImportError:
        return False
    current = getattr(flow_engine, "_send_heartbeats", None)
    if current is None or "join_on_exit" not in inspect.signature(current).parameters:
        return False  # another Prefect: its own heartbeats, joined or not
    if getattr(current, _INSTALLED_MARK, False):
        return True
    return install_attribute(flow_engine, "_send_heartbeats", not_joined)
