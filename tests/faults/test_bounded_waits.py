"""Every wait has a bound and a message: a straggling rank, an unreachable Ray address."""

from __future__ import annotations

import logging
import time

import pytest
from fault_helpers import start_driver
from fault_train_funcs import straggler_train_func

import trainlib
from trainlib import DataParallelTrainer

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(180)
def test_rank_running_long_after_the_others_is_named_then_failed(ray_session, storage_path, caplog):
    trainer = DataParallelTrainer(
        straggler_train_func,
        train_loop_config={"rank1_sleep_s": 300},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(
            name="straggler",
            storage_path=storage_path,
            verbose=False,
            failure_config=trainlib.FailureConfig(straggler_timeout_s=8),
        ),
    )
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="trainlib"), pytest.raises(trainlib.TrainingFailedError) as info:
        trainer.fit()
    elapsed = time.monotonic() - started
    failure = info.value.failures[0]
    assert failure.rank == 1, str(info.value)
    assert "still running" in failure.cause and "straggler_timeout_s=8" in failure.cause, failure.cause
    warnings = [
        r.getMessage() for r in caplog.records if "Rank 1" in r.getMessage() and "still running" in r.getMessage()
    ]
    assert warnings, caplog.text  # a warning before the failure
    assert elapsed < 8 + 60, elapsed  # not the 300 s the rank would have slept
    # The report every rank made before is committed and readable.
    assert trainlib.Result.from_path(f"{storage_path}/straggler").metrics == {"x": 1}


@pytest.mark.timeout(60)
def test_unreachable_ray_address_fails_in_seconds(tmp_path):
    driver = start_driver(
        f"""
        import time, trainlib
        from trainlib.torch import TorchTrainer
        started = time.monotonic()
        try:
            TorchTrainer(lambda: None, run_config=trainlib.RunConfig(storage_path={str(tmp_path)!r})).fit()
        except trainlib.TrainlibError as exc:
            print("ERROR", type(exc).__name__, exc)
        print("SECONDS", time.monotonic() - started)
    """,
        env={"RAY_ADDRESS": "127.0.0.1:1"},
    )
    out, _ = driver.communicate(timeout=50)
    assert "ERROR" in out and "127.0.0.1:1" in out and "RAY_ADDRESS" in out, out
    seconds = float(out.rsplit("SECONDS", 1)[1])
    assert seconds < 15, out
