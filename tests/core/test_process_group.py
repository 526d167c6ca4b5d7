"""Forming the gloo process group: a transient full-mesh connect failure is retried by all ranks together.

Two real processes form a real gloo group on 127.0.0.1; the failure is injected around
``torch.distributed.init_process_group`` (the real connect failure cannot be provoked on demand).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import free_port

CHILD = textwrap.dedent("""
    import datetime, faulthandler, json, sys
    faulthandler.dump_traceback_later(90, exit=True)  # a hang ends with every thread's stack in the output
    import torch, torch.distributed as dist
    from trainlib.torch._process_group import init_process_group

    rank, port, fail_on = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    calls = []

    def init(**kwargs):
        calls.append(1)
        mode = fail_on.get(f"{rank}:{len(calls)}")
        if mode == "before":  # fails before connecting, as when its peer closed the connection
            raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:561] Connection closed by peer")
        if mode == "other":
            raise RuntimeError("some other gloo error")
        dist.init_process_group(**kwargs)
        kwargs["store"].set(f"formed/{rank}", "1")
        if mode == "after":  # the group was formed here, but the rank reports a failure as a peer would
            # Once every peer has formed it too: leaving earlier fails a slower peer's connect for real
            # (seen on a loaded machine), and that peer then raises its own connect error, not the verdict.
            kwargs["store"].wait([f"formed/{r}" for r in range(2)])
            dist.destroy_process_group()
            raise RuntimeError("Gloo connectFullMesh failed with [pair.h:301] Connect timeout")

    try:
        init_process_group("gloo", "127.0.0.1", port, rank, 2, datetime.timedelta(seconds=60), init=init,
                           attempts=int(sys.argv[4]))
    except RuntimeError as exc:
        print("ERROR", str(exc).splitlines()[0], flush=True)
        sys.exit(3)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print("SUM", t.item(), "CALLS", len(calls), flush=True)
    dist.destroy_process_group()
""")


def _form(fail_on: dict[str, str], attempts: int = 3, port_retries: int = 2) -> list[tuple[int, str]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(rank), str(port), json.dumps(fail_on), str(attempts)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        outs.append((p.returncode, out))
    # Another process of the suite may bind the free port before rank 0's store does: try another port.
    if port_retries and any("EADDRINUSE" in out for _, out in outs):
        return _form(fail_on, attempts, port_retries - 1)
    return outs


@pytest.mark.parametrize(
    "fail_on",
    [
        {"0:1": "before", "1:1": "before"},  # both ranks fail their first connect
        {"0:1": "after"},  # rank 1 joined, rank 0 failed: rank 1 leaves and both retry
    ],
    ids=["both-fail", "one-fails"],
)
def test_a_transient_connect_failure_is_retried_by_all_ranks(fail_on):
    outs = _form(fail_on)
    for code, out in outs:
        assert code == 0, out
        assert "SUM 3.0 CALLS 2" in out, out  # one all-reduce over both ranks, on the second try


def test_other_errors_and_the_last_try_are_not_retried():
    outs = _form({"0:1": "other", "1:1": "other"})
    assert all(code == 3 and "ERROR some other gloo error" in out for code, out in outs), outs
    outs = _form({"0:1": "before", "1:1": "before"}, attempts=1)
    assert all(code == 3 and "connectFullMesh" in out for code, out in outs), outs
    outs = _form({"0:1": "after", "0:2": "after"}, attempts=2)
    assert outs[0][0] == 3 and "connectFullMesh" in outs[0][1], outs
    assert outs[1][0] == 3 and "could not be formed in 2 tries: rank(s) [0]" in outs[1][1], outs


def test_a_single_try_forms_the_group_without_a_verdict_round():
    # The path nccl takes (one try): the group forms and works on the first call.
    for code, out in _form({}, attempts=1):
        assert code == 0 and "SUM 3.0 CALLS 1" in out, out


# Rank 0's side as a TrainWorker runs it: the driver has it open the rendezvous first, then starts every rank.
EARLY_RANK0 = textwrap.dedent("""
    import faulthandler, socket, sys
    faulthandler.dump_traceback_later(90, exit=True)
    import torch, torch.distributed as dist
    from trainlib._internal.execution.spec import WorkerInfo
    from trainlib.torch._backend import TorchBackend
    from trainlib.torch.config import TorchConfig

    backend = TorchBackend(TorchConfig(), use_gpu=False)
    port = backend.open_rendezvous("127.0.0.1", 2)
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # listening before this rank starts
    print("PORT", port, flush=True)
    sys.stdin.readline()  # rank 1 connects meanwhile
    backend.on_start(WorkerInfo(world_rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0,
                                master_addr="127.0.0.1", master_port=port))
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    print("SUM", t.item(), flush=True)
    backend.on_shutdown()
""")

EARLY_RANK1 = textwrap.dedent("""
    import datetime, faulthandler, sys
    faulthandler.dump_traceback_later(90, exit=True)
    import torch, torch.distributed as dist
    from trainlib.torch._process_group import init_process_group

    port = int(sys.argv[1])
    # A client of rank 0's store, connected while rank 0 has not started (one try: no waiting for it).
    dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=60))
    print("CONNECTED", flush=True)
    init_process_group("gloo", "127.0.0.1", port, 1, 2, datetime.timedelta(seconds=60))
    t = torch.tensor([2.0])
    dist.all_reduce(t)
    print("SUM", t.item(), flush=True)
    dist.destroy_process_group()
""")


def test_rank_zero_opens_its_store_before_any_rank_starts_so_early_ranks_connect_at_once():
    # torch's store client backs off while nothing listens (0.93 s lost by a rank 0.5 s early): the
    # store is up from open_rendezvous on, and rank 0 forms the group on that same store.
    rank0 = subprocess.Popen(
        [sys.executable, "-c", EARLY_RANK0],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rank1 = None
    try:
        first = rank0.stdout.readline()
        assert first.startswith("PORT "), first + rank0.stdout.read()
        rank1 = subprocess.Popen(
            [sys.executable, "-c", EARLY_RANK1, first.split()[1]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        connected = rank1.stdout.readline()
        assert connected.strip() == "CONNECTED", connected + rank1.stdout.read()
        out0, _ = rank0.communicate("go\n", timeout=120)
        out1, _ = rank1.communicate(timeout=120)
    finally:
        for p in (rank0, rank1):
            if p is not None and p.poll() is None:
                p.kill()
    assert rank0.returncode == 0 and "SUM 3.0" in out0, out0
    assert rank1.returncode == 0 and "SUM 3.0" in out1, out1


def test_a_backend_without_a_rendezvous_of_its_own_gives_a_free_port():
    import socket

    from trainlib._internal.execution.worker import WorkerBackend
    from trainlib.torch._backend import TorchBackend
    from trainlib.torch.config import TorchConfig

    for backend in (WorkerBackend(), TorchBackend(TorchConfig(), use_gpu=False)):  # torch's, with one rank
        port = backend.open_rendezvous("127.0.0.1", 1)
        with socket.socket() as s:
            s.bind(("", port))  # nothing holds it
