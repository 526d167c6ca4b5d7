"""trainlib.collective (Ray Train's ray.train.collective): barrier and broadcast_from_rank_zero on 2 real workers,
in local mode (num_workers=0), and outside a worker, with Ray Train's errors and warnings."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

import trainlib
from trainlib.collective import CollectiveTimeoutError, barrier, broadcast_from_rank_zero
from trainlib.torch import TorchTrainer


def _fit(func, storage_path, config, num_workers=2, env=None):
    return TorchTrainer(
        func,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(num_workers=num_workers),
        run_config=trainlib.RunConfig(
            storage_path=storage_path, verbose=False, worker_runtime_env={"env_vars": env} if env else None
        ),
    ).fit()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def collectives_func(config):
    rank = trainlib.get_context().get_world_rank()
    out = {"rank": rank}
    # Unpicklable data fails on the rank that passed it, before any rank waits (the ranks stay in step).
    if rank == 0:
        try:
            broadcast_from_rank_zero(threading.Lock())
        except TypeError as exc:
            out["unpicklable"] = type(exc).__name__
    # Several calls in a row: each rank gets rank 0's value of the same call.
    out["values"] = [broadcast_from_rank_zero({"round": i} if rank == 0 else f"ignored {rank}") for i in range(3)]
    # barrier: rank 0 passes only after rank 1 (which arrives late) wrote its file.
    marker = os.path.join(config["out"], "rank1_before_barrier")
    if rank == 1:
        time.sleep(1.0)
        with open(marker, "w"):
            pass
    out["barrier"] = barrier()
    out["saw_rank1_file_after_barrier"] = os.path.exists(marker)
    records = _Records()
    logging.getLogger("trainlib").addHandler(records)
    out["big"] = len(broadcast_from_rank_zero("x" * 2000 if rank == 0 else None))
    logging.getLogger("trainlib").removeHandler(records)
    out["size_warning"] = any("exceeds the maximum broadcast size of 1000 bytes" in m for m in records.messages)
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def test_broadcast_and_barrier_on_two_workers(ray_session, storage_path, tmp_path):
    _fit(collectives_func, storage_path, {"out": str(tmp_path)})
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for out in ranks:
        assert out["values"] == [{"round": 0}, {"round": 1}, {"round": 2}]
        assert out["barrier"] is None
        assert out["big"] == 2000
    assert ranks[0]["unpicklable"] == "TypeError"
    assert ranks[0]["saw_rank1_file_after_barrier"]
    assert ranks[0]["size_warning"] and not ranks[1]["size_warning"]  # warned where the data was passed


def late_rank_func(config):
    if trainlib.get_context().get_world_rank() == 1:
        time.sleep(4)  # never joins; finishes so the run ends
        return None
    try:
        barrier()
    except CollectiveTimeoutError as exc:
        return {"missing": exc.missing_ranks, "message": str(exc), "is_timeout": isinstance(exc, TimeoutError)}
    return {"missing": None}


def test_timeout_names_the_missing_ranks(ray_session, storage_path):
    result = _fit(late_rank_func, storage_path, {}, env={"RAY_TRAIN_COLLECTIVE_TIMEOUT_S": "1"})
    value = result.return_value
    assert value["missing"] == [1] and value["is_timeout"]
    assert "RAY_TRAIN_COLLECTIVE_TIMEOUT_S" in value["message"] and "[1]" in value["message"]


def local_func(config):
    data = {"a": 1}
    return {"same": broadcast_from_rank_zero(data) is data, "barrier": barrier()}


def test_local_mode_returns_the_data_itself_and_barrier_passes(storage_path):
    result = _fit(local_func, storage_path, {}, num_workers=0)
    assert result.return_value == {"same": True, "barrier": None}


@pytest.mark.parametrize("call", [barrier, lambda: broadcast_from_rank_zero(1)])
def test_outside_a_worker_is_a_runtime_error(call):
    with pytest.raises(RuntimeError, match="outside a training worker"):
        call()
