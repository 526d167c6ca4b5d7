"""Symlinks in a checkpoint folder are never followed out of it: report() refuses them, naming the link.

Decision (docs/faults.md): a link whose target lies outside the checkpoint folder, or any link to
a folder, is refused with a ValueError in report() before anything is copied; a link to a file
inside the folder is stored as a regular copy of that file (its content is part of the checkpoint
anyway). The checkpoints committed before the refused report stay committed.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from fault_train_funcs import symlink_train_func

import trainlib
from trainlib import DataParallelTrainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "root:x:0:0:trainlib-secret-canary\n"


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "outside" / "passwd"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


@pytest.mark.parametrize("target", ["file", "folder"])
def test_link_leaving_the_folder_is_refused(ray_session, storage_path, secret_file, target):
    link_to = str(secret_file if target == "file" else secret_file.parent)
    trainer = DataParallelTrainer(
        symlink_train_func,
        train_loop_config={"link_to": link_to},
        run_config=trainlib.RunConfig(name=f"links-{target}", storage_path=storage_path, verbose=False),
    )
    with pytest.raises(trainlib.TrainingFailedError) as info:
        trainer.fit()
    cause = info.value.failures[0].cause
    assert "ValueError" in cause and "symlink" in cause and "'leak'" in cause and link_to in cause, cause
    assert "copy" in cause.lower()  # the fix: copy the file into the folder
    run = os.path.join(storage_path, f"links-{target}")
    # The secret reached no file of run storage, under any name.
    grep = subprocess.run(["grep", "-r", "-l", "trainlib-secret-canary", run], capture_output=True, text=True)
    assert grep.stdout == "", grep.stdout
    # Nothing committed was lost: checkpoint 1 is there and readable.
    result = trainlib.Result.from_path(run)
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000001")
    with result.checkpoint.as_directory() as folder:
        assert open(os.path.join(folder, "state.txt")).read() == "good"


def test_link_inside_the_folder_is_stored_as_a_file(ray_session, storage_path):
    config = {"link_to": "state.txt", "link_name": "alias.txt"}
    result = DataParallelTrainer(
        symlink_train_func,
        train_loop_config=config,
        run_config=trainlib.RunConfig(name="links-inside", storage_path=storage_path, verbose=False),
    ).fit()
    stored = os.path.join(result.checkpoint.path, "alias.txt")
    assert not os.path.islink(stored) and open(stored).read() == "second"
