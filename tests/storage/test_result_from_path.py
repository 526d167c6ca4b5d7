"""Result: its metrics DataFrame is built on first use, so fit() and Result.from_path never import pandas."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

CHILD = r"""
import sys
import fsspec
from trainlib._internal.storage.run_record import RUN_STATE_FILE
from trainlib._internal.storage.run_storage import RunStorage
import trainlib

storage = RunStorage(fsspec.filesystem("file"), sys.argv[1], "run")
storage.write_json_atomic(storage.join(RUN_STATE_FILE), {"name": "run", "status": "FINISHED", "checkpoint_config": {}})
rows = []
for step in (1, 2, 3):
    rows.append({"step": step, "attempt": 0, "time": 100.0 + step, "checkpoint": None, "metrics": {"loss": 1 / step}})
    storage.append_metrics_row(rows[-1], rows)
result = trainlib.Result.from_path(storage.run_path)
assert result.metrics == {"loss": 1 / 3}, result.metrics
assert "pandas" not in sys.modules, "Result.from_path imported pandas"
df = result.metrics_dataframe
assert "pandas" in sys.modules
assert list(df["step"]) == [1, 2, 3] and list(df["loss"]) == [1, 1 / 2, 1 / 3], df
assert list(df["timestamp"]) == [101.0, 102.0, 103.0] and set(df["attempt"]) == {0}
assert result.metrics_dataframe is df  # built once
empty = trainlib.Result(metrics=None, checkpoint=None, path="nowhere")
assert empty.metrics_dataframe is None
print("OK")
"""


def test_metrics_dataframe_is_built_on_first_use(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr
