"""Failures of a worker group: the error reported for a failed attempt and its root cause. Driver only.

Whether the group restarts after it is ``restart_policy.py``'s decision.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import cloudpickle  # the pickler of train_fn.py

from trainlib._internal.execution.messages import FailedMessage
from trainlib._internal.execution.placement import RankPlan
from trainlib.errors import WorkerError

logger = logging.getLogger("trainlib")


def worker_error(message: FailedMessage, plan: RankPlan | None) -> WorkerError:
    """The driver-side error for a rank's failure message (its original exception as ``__cause__``)."""
    rank = message.rank
    node_ip = plan.node_ips[rank] if plan is not None else ""
    error = WorkerError(rank=rank, cause=message.cause, traceback_text=message.traceback_text, node_ip=node_ip)
    if message.exception_payload is not None:
        try:
            error.__cause__ = cloudpickle.loads(message.exception_payload)
        except Exception:  # noqa: BLE001 - the exception's class may not import on the driver
            pass
    return error


def straggler_error(running: list[int], done: list[int], waited: float, timeout_s: float) -> WorkerError:
    """The failure of ranks still running ``timeout_s`` after the others finished."""
    return WorkerError(
        rank=running[0],
        cause=(
            f"{ranks_text(running)} still running {waited:.0f} s after {ranks_text(done)} finished the training "
            f"function (FailureConfig.straggler_timeout_s={timeout_s:g}): a rank may be stuck (in a "
            "collective its peers never joined, a data loader, I/O), or the ranks run different numbers of steps. "
            "Make every rank run the same loop, or raise straggler_timeout_s if the imbalance is expected."
        ),
    )


# Errors a rank gets because a peer died or failed (its collective lost the connection):
# they are consequences, and the peer's own failure is the one to report.
_PEER_LOST_SIGNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "nccl communicator was aborted",
    "remote process exited",
)


def root_cause(failures: list[WorkerError]) -> WorkerError:
    """The failure to report among those of one attempt: the first that is not a lost-peer echo."""

    def is_echo(failure: WorkerError) -> bool:
        return any(sign in failure.cause.lower() for sign in _PEER_LOST_SIGNS)

    first = next((f for f in failures if not is_echo(f)), failures[0])
    for other in failures:
        if other is not first and other.rank != first.rank:
            logger.info("Rank %d also failed, after rank %d: %s", other.rank, first.rank, other.cause[:300])
    return first


def ranks_text(ranks: list[int]) -> str:
    """'rank 1' or 'ranks 1, 2'."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def death_cause(ray_text: str, pid: Any, node_ip: Any) -> str:
    """A dead worker's cause in one line: Ray's exit type and detail, and where to find the exit status.

    Ray does not know a killed process's signal or exit status (its raylet sees a closed
    connection), so the message says where the kernel recorded it.
    """
    import re

    # Before its placement is known (a death while the group starts), Ray's own text holds the pid and node.
    if pid is None:
        found = re.search(r"\bpid[=:]\s*(\d+)", ray_text)
        pid = int(found.group(1)) if found else "unknown"
    if node_ip is None:
        found = re.search(r"\bip[=:]\s*([0-9A-Fa-f.:]+[0-9A-Fa-f])", ray_text)
        node_ip = found.group(1) if found else "unknown"
    missing = re.search(r"No module named '(trainlib|tasks|flows)[\w.]*'", ray_text)
    if missing:
        return (
            f"the worker process (pid {pid}) on node {node_ip} cannot import {missing.group(1)!r}: that node's "
            f"Python has Ray but not this project. Install it there (pip install -e <this repository> in the "
            "Python that runs the node's `ray start`), or start the node from an image or virtual environment "
            "that has it"
        )
    exit_type = re.search(r"Worker exit type: (\w+)", ray_text)
    detail = re.search(r"Worker exit detail: (.*?\.)(?:\s|$)", ray_text)
    if exit_type or detail:
        said = f"Ray's exit type {exit_type.group(1) if exit_type else '?'}: {detail.group(1) if detail else ''}"
    else:
        lines = [line.strip() for line in ray_text.strip().splitlines() if line.strip()]
        said = next(
            (line for line in lines if "exit" in line.lower() or "killed" in line.lower() or "OOM" in line),
            lines[0] if lines else "no detail",
        )
    return (
        f"the worker process (pid {pid}) on node {node_ip} died ({said.strip()}). Its exit status is not "
        f"known to Ray: a SIGKILL, the kernel's OOM killer (`dmesg | grep -i 'killed process {pid}'` on that "
        "node) or a crash in native code (the worker's log: `ray logs worker` / /tmp/ray/session_latest/logs)"
    )
