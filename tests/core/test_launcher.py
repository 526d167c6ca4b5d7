"""``python -m trainlib SCRIPT [ARGS...]``: the script runs as with ``python SCRIPT``, on a Ray started before its
first line; a script's own ``ray.init`` gets the Ray it asks for; bad input and clusters start nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, processes_whose_command_line

FIT_SCRIPT = """
import os, sys
import ray
started_ahead = ray.is_initialized()  # before any import of the script's own
import helper_next_to_the_script  # importable: the script's folder is first on the path, as with `python SCRIPT`
import trainlib


def train_func(config):
    trainlib.report({"arg": config["arg"], "rank": trainlib.get_context().get_world_rank()})


if __name__ == "__main__":
    result = trainlib.DataParallelTrainer(
        train_func, train_loop_config={"arg": sys.argv[1]}, scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="launched", storage_path=sys.argv[3])).fit()
    print("STATE " + json.dumps({
        "started_ahead": started_ahead, "argv": sys.argv[1:], "file": os.path.abspath(__file__),
        "metrics": result.metrics, "error": repr(result.error), "ray_cpus": ray.cluster_resources().get("CPU"),
        "session": ray.get_runtime_context().gcs_address}), flush=True)
""".replace("import os, sys", "import json, os, sys")

OWN_RAY_SCRIPT = """
import json
import ray
started_ahead = ray.is_initialized()
ahead_gcs = ray.get_runtime_context().gcs_address if started_ahead else None
ray.init(address="local", num_cpus=3)  # the script's own Ray, as without the launcher
print("STATE " + json.dumps({"started_ahead": started_ahead, "ray_cpus": ray.cluster_resources()["CPU"],
                             "new_gcs": ray.get_runtime_context().gcs_address != ahead_gcs}), flush=True)
"""

PROBE_SCRIPT = """
import ray
print("INITIALIZED", ray.is_initialized(), flush=True)
"""


def _launch(tmp_path, source: str, *args: str, env_extra: dict[str, str] | None = None, timeout: float = 300):
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    script = folder / "job.py"
    script.write_text(source)
    (folder / "helper_next_to_the_script.py").write_text("")
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "RAY_TMPDIR": "/tmp", **(env_extra or {})}
    if "RAY_ADDRESS" not in (env_extra or {}):
        env.pop("RAY_ADDRESS", None)
    # From another folder: the script's folder, not the working one, must come first on its import path.
    return subprocess.run(
        [sys.executable, "-m", "trainlib", str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _state(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("STATE "))
    return json.loads(line[len("STATE ") :])


@pytest.mark.timeout(600)
def test_a_script_runs_as_main_with_its_arguments_on_a_ray_started_before_its_first_line(tmp_path):
    # "--steps" after SCRIPT is the script's own option, not the launcher's.
    state = _state(_launch(tmp_path, FIT_SCRIPT, "hello", "--steps", str(tmp_path / "runs")))
    assert state["started_ahead"] is True
    assert state["argv"] == ["hello", "--steps", str(tmp_path / "runs")]
    assert state["file"] == str(tmp_path / "project" / "job.py")
    assert state["error"] == "None" and state["metrics"]["arg"] == "hello"
    assert state["ray_cpus"] == os.cpu_count()  # trainlib's embedded Ray: every CPU of this machine
    port = state["session"].rsplit(":", 1)[1]  # the GCS's: its daemons' and workers' command lines name it
    assert not _processes_naming(port), "the Ray started ahead outlived the script"


def _processes_naming(port: str) -> list[str]:
    return processes_whose_command_line(lambda cmd: f"={port}" in cmd or f":{port}" in cmd)


@pytest.mark.timeout(300)
def test_a_scripts_own_ray_init_gets_the_ray_it_asks_for(tmp_path):
    state = _state(_launch(tmp_path, OWN_RAY_SCRIPT))
    assert state["started_ahead"] is True
    assert state["new_gcs"] is True and state["ray_cpus"] == 3


def test_nothing_starts_for_a_missing_script_or_a_cluster_address(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trainlib", str(tmp_path / "missing.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "missing.py': no such file" in out.stderr
    # A cluster's address: fit() would join it, not start a Ray, so nothing is started ahead either.
    out = _launch(tmp_path, PROBE_SCRIPT, env_extra={"RAY_ADDRESS": "127.0.0.1:1"}, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "INITIALIZED False" in out.stdout
