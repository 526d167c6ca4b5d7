"""The user's training function reaches processes that cannot import its module (trainlib._internal.execution.user_code)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

from ray import cloudpickle  # trainlib's pickler

from trainlib._internal.execution.train_fn import TrainFunction
from trainlib._internal.execution.user_code import dumps_for_workers, missing_modules, user_modules

LOADER = "import sys, pickle; f = pickle.loads(sys.stdin.buffer.read()); print(f({'x': 4}))"


def _load_elsewhere(payload: bytes, cwd) -> subprocess.CompletedProcess:
    """Unpickle and call in a fresh Python whose path does not hold the user's folder."""
    return subprocess.run([sys.executable, "-c", LOADER], input=payload, capture_output=True, cwd=cwd)


def test_function_from_a_module_the_worker_lacks_is_shipped_by_value(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_helpers.py").write_text("def square(v):\n    return v * v\n")
    (code / "my_training.py").write_text(
        textwrap.dedent("""
        import my_helpers
        from my_helpers import square
        OFFSET = 1

        def train_func(config):
            return square(config["x"]) + my_helpers.square(1) + OFFSET
    """)
    )
    monkeypatch.syspath_prepend(str(code))
    importlib.invalidate_caches()
    module = importlib.import_module("my_training")
    try:
        names = user_modules(module.train_func)
        assert names == ["my_training", "my_helpers"]
        assert missing_modules(["my_training", "json", "no_such_module_xyz"]) == ["no_such_module_xyz"]

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        by_reference = _load_elsewhere(cloudpickle.dumps(module.train_func), elsewhere)
        assert by_reference.returncode != 0 and b"No module named 'my_training'" in by_reference.stderr
        shipped = _load_elsewhere(dumps_for_workers(module.train_func, names), elsewhere)
        assert shipped.returncode == 0, shipped.stderr.decode()
        assert shipped.stdout.strip() == b"18"
        # The by-value registration is undone: later pickles are by reference again.
        assert "my_training" not in cloudpickle.list_registry_pickle_by_value()

        # What trainlib sends its workers: the bound function, re-pickled with the missing modules.
        bound = TrainFunction.bind(module.train_func, {"x": 5})
        assert bound.user_modules == ("my_training", "my_helpers")
        shipped_bound = bound.by_value(["my_training", "my_helpers"])
        loader = "import sys, pickle; print(pickle.loads(sys.stdin.buffer.read()).load()())"
        done = subprocess.run(
            [sys.executable, "-c", loader], input=cloudpickle.dumps(shipped_bound), capture_output=True, cwd=elsewhere
        )
        assert done.returncode == 0 and done.stdout.strip() == b"27", done.stderr.decode()
    finally:
        sys.modules.pop("my_training", None)
        sys.modules.pop("my_helpers", None)


def test_installed_packages_are_not_candidates():
    import json

    import torch

    def func(config):
        return json.dumps(torch.tensor([1]).tolist())

    assert user_modules(func) == [__name__.split(".")[0]]  # this test module, not json or torch
    assert "torch" not in user_modules(func) and "json" not in user_modules(func)


def test_a_function_shipped_by_value_fails_with_its_file_and_line_in_the_traceback(tmp_path, monkeypatch):
    """A script's training function is pickled by value (so is a module a node lacks). Its traceback in a worker
    must still name the user's file and show the failing line, as under Ray Train: upstream cloudpickle 3.1 writes
    "<dynamic-code>" for the file, Ray's copy keeps it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_script.py").write_text(
        textwrap.dedent("""
        def train_func(config):
            labels = {"a": 1}
            return labels[config["key"]]  # the failing line
    """)
    )
    monkeypatch.syspath_prepend(str(code))
    importlib.invalidate_caches()
    module = importlib.import_module("my_script")
    try:
        shipped = TrainFunction.bind(module.train_func, {"key": "b"}).by_value(["my_script"])
        loader = (
            "import pickle, sys, traceback\nf = pickle.loads(sys.stdin.buffer.read()).load()\n"
            "try:\n    f()\nexcept KeyError:\n    print(traceback.format_exc())"
        )
        done = subprocess.run(
            [sys.executable, "-c", loader],
            input=cloudpickle.dumps(shipped),
            capture_output=True,
            cwd=tmp_path,
            text=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        text = done.stdout.decode()
        assert f'File "{code / "my_script.py"}", line 4, in train_func' in text, text
        assert 'return labels[config["key"]]  # the failing line' in text
    finally:
        sys.modules.pop("my_script", None)
