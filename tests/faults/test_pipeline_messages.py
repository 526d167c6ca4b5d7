"""The pipeline command's smaller messages: an unwritable home is one line and exit 2; a second command on a fresh
home waits for the first one's Prefect start (a lock file) or says so."""

from __future__ import annotations

import fcntl
import os

import pytest

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
