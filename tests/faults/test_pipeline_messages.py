"""The pipeline's smaller messages: an unwritable home is one line and exit 2; a second command on a fresh home waits
for the first one's Prefect start (a lock file) or says so; a run name reused with another recipe, or a run whose
checkpoints were deleted, says what happened and what to do."""

from __future__ import annotations

import fcntl
import os

import pytest

import trainlib
from flows.main import main
from flows.prefect_server import START_LOCK_FILE, start_lock
from tasks.domain.home import PipelineHome

pytestmark = [pytest.mark.timeout(60)]


def test_an_unwritable_home_is_one_line_and_exit_2(tmp_path, capsys):
    blocked = tmp_path / "a_file"  # a file where the home's folder should be: no user can write there
    blocked.write_text("")
    assert main(["--home", str(blocked / "home"), "--mirrors", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"home {blocked / 'home'} cannot be written" in err and "--home" in err, err


def test_a_second_start_on_one_home_waits_for_the_first_or_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINLIB_HOME", str(tmp_path))
    home = PipelineHome.resolve()
    os.makedirs(home.root, exist_ok=True)
    with open(os.path.join(home.root, START_LOCK_FILE), "a+") as other:  # another command is starting Prefect
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match=r"Another command has been starting the Prefect server .* for more"):
            with start_lock(home, timeout_s=0.5):
                pass
        assert "waiting for it" in capsys.readouterr().out
        fcntl.flock(other, fcntl.LOCK_UN)
    with start_lock(home, timeout_s=0.5):  # free again
        pass


def recipe_train_func(config):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "model.pt"), "w") as f:
            f.write(config["recipe"]["name"])
        trainlib.report({"val_accuracy": 0.5}, checkpoint=trainlib.Checkpoint.from_directory(folder))


@pytest.mark.integration
def test_a_run_name_reused_with_another_recipe_or_deleted_checkpoints_says_so(ray_session, storage_path):
    import shutil

    from tasks.domain.training_run import check_same_training, chosen_checkpoint

    config = {"dataset": "fashion-mnist", "recipe": {"name": "tutorial", "lr": 0.001}}
    result = trainlib.DataParallelTrainer(
        recipe_train_func,
        train_loop_config=config,
        run_config=trainlib.RunConfig(name="reused", storage_path=storage_path, verbose=False),
    ).fit()
    check_same_training(result.path, config)  # a retry of the same run: continued or reused
    other = {**config, "recipe": {"name": "augmented", "lr": 0.05}}
    with pytest.raises(ValueError, match=r"another data set or recipe \(recipe .*'tutorial'.* there, .*'augmented'"):
        check_same_training(result.path, other)

    shutil.rmtree(result.checkpoint.path)
    with pytest.raises(RuntimeError, match=r"committed checkpoints \(checkpoint_000001\), but none is left"):
        chosen_checkpoint(trainlib.Result.from_path(result.path))
