"""Ray Tune over trainlib's trainers, Ray Train v2's way: a Tune function trainable builds and fits a trainer per
trial, and Ray Tune's own TuneReportCallback (a Ray Train UserCallback) reports each trial's metrics and checkpoint
paths back to Tune. 4 trials of a tiny 2-worker job (plain Python: the test is about Tune, examples/tune_tutorial.py tunes the
tutorial's job), 2 at a time, each trial reserving no CPU of its own."""

from __future__ import annotations

import pytest

import trainlib
from trainlib import DataParallelTrainer

pytestmark = pytest.mark.integration


def train_func(config):
    import os
    import tempfile

    w = 0.0
    for step in range(3):
        w += config["lr"]  # the "loss" below is lowest for the lr closest to 0.3
        with tempfile.TemporaryDirectory() as folder:
            if trainlib.get_context().get_world_rank() == 0:
                with open(os.path.join(folder, "w.txt"), "w") as f:
                    f.write(str(w))
            checkpoint = trainlib.Checkpoint.from_directory(folder)
            trainlib.report({"loss": abs(w - 0.9), "step": step}, checkpoint=checkpoint)


def test_a_tune_sweep_of_four_trials_fits_a_trainer_per_trial(ray_session, tmp_path):
    import sys

    import ray.cloudpickle
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Tune's trial actors cannot import this module

    storage = str(tmp_path / "runs")

    def train_driver_fn(config):
        trainer = DataParallelTrainer(
            train_func,
            train_loop_config=config["train_loop_config"],
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(
                name=f"train-trial_id={ray.tune.get_context().get_trial_id()}",
                storage_path=storage,
                callbacks=[TuneReportCallback()],
                verbose=False,
            ),
        )
        trainer.fit()

    tuner = ray.tune.Tuner(
        # The trial only drives its trainer: it reserves no CPU (Tune refuses an empty request: a byte of memory
        # instead), so 2 trials' 4 workers fit the 4 CPUs.
        ray.tune.with_resources(train_driver_fn, {"cpu": 0, "memory": 1}),
        param_space={"train_loop_config": {"lr": ray.tune.grid_search([0.1, 0.2, 0.3, 0.5])}},
        tune_config=ray.tune.TuneConfig(max_concurrent_trials=2, metric="loss", mode="min"),
        run_config=ray.tune.RunConfig(storage_path=str(tmp_path / "tune"), name="sweep", verbose=0),
    )
    results = tuner.fit()
    assert results.num_errors == 0 and len(results) == 4
    assert all(r.metrics["training_iteration"] == 3 for r in results)  # every report reached Tune
    best = results.get_best_result()
    assert best.config["train_loop_config"]["lr"] == 0.3 and best.metrics["loss"] < 1e-6
    # The checkpoint path Tune got is the trial's trainlib checkpoint, readable as Ray Train gives it.
    path = best.metrics["checkpoint_path"]
    assert path.startswith(storage) and path.endswith("checkpoint_000003")
