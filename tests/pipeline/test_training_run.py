"""The pipeline's training run on real Ray (no Prefect): rank 0's in-epoch progress reaches the board, a
finished run is read back instead of trained again, an interrupted one resumes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _settings(tmp_path, **overrides):
    from tasks.domain.recipe import get_recipe
    from tasks.domain.training_run import TrainingSettings

    values = dict(
        run_name="pipeline-run",
        storage_path=str(tmp_path / "runs"),
        node_cache_dir=str(tmp_path / "node"),
        epochs=2,
        recipe=get_recipe("tutorial"),
        batch_size=32,
        num_workers=2,
        use_gpu=False,
        num_to_keep=2,
        checkpoint_score_attribute="val_accuracy",
        max_failures=0,
        limit=None,
        seed=0,
        placement_timeout_s=60.0,
    )
    return TrainingSettings(**{**values, **overrides})


@pytest.fixture
def staged(tmp_path):
    from tasks.domain.generated_dataset import write_idx_dataset
    from tasks.domain.staging import fetch_and_stage

    md5s = write_idx_dataset(tmp_path / "mirror", n_train=256, n_test=32)
    assert md5s
    return fetch_and_stage(
        "fashion-mnist",
        [str(tmp_path / "mirror")],
        str(tmp_path / "cache"),
        str(tmp_path / "runs" / "datasets"),
        md5s=md5s,
    )


def test_progress_reaches_the_board_and_a_finished_run_is_not_trained_again(ray_session, tmp_path, staged):
    from tasks.domain.progress import EpochProgress, ProgressBoard
    from tasks.domain.training_run import run_training, training_outcome

    board = ProgressBoard.create()
    assert board.latest() is None
    settings = _settings(tmp_path)
    fit = run_training(settings, staged, [], board)
    assert not fit.reused and fit.result.error is None
    outcome = training_outcome(fit, None, settings.recipe.architecture)
    assert [row["epoch"] for row in outcome.history] == [0, 1]
    last = board.latest()  # read in this process, from what rank 0 wrote in its own
    assert isinstance(last, EpochProgress)
    assert (last.epoch, last.epochs, last.step) == (1, 2, last.steps) and last.images_per_s > 0

    again = run_training(_settings(tmp_path), staged, [], None)  # a retried flow run, after training finished
    assert again.reused and again.seconds == 0
    assert training_outcome(again, None, settings.recipe.architecture).checkpoint_uri == outcome.checkpoint_uri
    assert len(again.result.metrics_dataframe) == 2  # nothing trained twice
    board.remove()
    assert board.latest() is None
