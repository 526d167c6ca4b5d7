"""The flow's task runner on a cluster: code shipped as py_modules, Ray jobs respected, the reach guard wired."""

from __future__ import annotations

import json
import os

import pytest

from flows import task_runner
from flows.preflight import cluster_address
from flows.task_runner import check_cluster_reach, make_task_runner, project_modules
from tasks.domain.reachability import UnreachableFromClusterError

API = "http://127.0.0.1:4200/api"


@pytest.fixture
def no_ray_env(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(task_runner.RAY_JOB_CONFIG_ENV_VAR, raising=False)


def test_local_ray_ships_nothing(no_ray_env):
    runner = make_task_runner(None, API)
    assert runner.address == "local"
    assert "runtime_env" not in runner.init_kwargs  # the workers inherit their environment from the raylet
    assert runner.worker_env["PREFECT_API_URL"] == API


def test_cluster_gets_the_project_code(no_ray_env):
    runner = make_task_runner("ray://head:10001", API)
    assert runner.address == "ray://head:10001"
    modules = runner.init_kwargs["runtime_env"]["py_modules"]
    assert [os.path.basename(m) for m in modules] == ["trainlib", "tasks", "flows", "deployments"]
    assert all(os.path.isfile(os.path.join(m, "__init__.py")) for m in modules)
    assert modules == project_modules()


def test_ray_address_comes_from_the_environment_inside_a_ray_job(no_ray_env, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert cluster_address(None) == "10.0.0.5:6379" and cluster_address("other:6379") == "other:6379"
    # A submitted job: its working_dir already carries the code, its env vars must not be given twice.
    monkeypatch.setenv(
        task_runner.RAY_JOB_CONFIG_ENV_VAR,
        json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip", "env_vars": {"PREFECT_API_URL": API}}}),
    )
    runner = make_task_runner(None, API)
    assert runner.address == "10.0.0.5:6379"
    env = runner.init_kwargs["runtime_env"]
    assert "py_modules" not in env and "PREFECT_API_URL" not in env["env_vars"]
    assert env["env_vars"]["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] == "false"


def test_reach_guard_reads_the_cluster_nodes(monkeypatch):
    import ray

    nodes = [{"NodeManagerAddress": "127.0.0.2", "Alive": True}, {"NodeManagerAddress": "10.77.0.9", "Alive": True}]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    with pytest.raises(UnreachableFromClusterError, match="10.77.0.9") as info:
        check_cluster_reach(API, "sqlite:///x.db", "s3://bucket/runs", None)
    assert "PREFECT_API_URL" in str(info.value) and "mlflow_tracking_uri" in str(info.value)
    nodes[1]["Alive"] = False  # a dead node is not asked to reach anything
    check_cluster_reach(API, "sqlite:///x.db", "/tmp/runs", ["/data/mirror"])


LOCAL_RUNNER_SCRIPT = r"""
import json, os, time
import psutil
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from flows.task_runner import make_task_runner


class Probe:
    def pid(self):
        return os.getpid()


def actor_gets_an_idle_worker():
    # The pipeline's train step in small: a zero-CPU task holds one worker (the train task) while another has
    # idled over a second; then a placement group takes every CPU and an actor asks for a worker in it.
    raylet = psutil.Process(ray._private.worker._global_node.all_processes["raylet"][0].process.pid)

    def workers():  # the raylet's worker processes (titled ray::IDLE, ray::<task>...), not its agents
        pids = set()
        for child in raylet.children():
            try:
                if (child.cmdline() or [""])[0].startswith("ray::"):
                    pids.add(child.pid)
            except psutil.Error:  # ended meanwhile
                pass
        return pids

    hold = ray.remote(num_cpus=0)(lambda: time.sleep(3)).remote()
    deadline = time.monotonic() + 20
    while len(workers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = workers()
    time.sleep(1.5)
    group = placement_group([{"CPU": 1}] * int(ray.cluster_resources()["CPU"]))
    ray.get(group.ready())
    time.sleep(0.6)  # Ray looks for idle workers to end every 0.2 s
    actor = ray.remote(num_cpus=1)(Probe).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)).remote()
    pid = ray.get(actor.pid.remote())
    ray.kill(actor)
    remove_placement_group(group)
    ray.get(hold)
    return pid in before


with make_task_runner(None, "http://127.0.0.1:9/api") as runner:
    @ray.remote
    def env_and_modules():
        import gc, sys
        # The preload ran without the cyclic collector (bulk_imports.py): on now, the preload's survivors frozen.
        return os.environ.get("PREFECT_API_URL"), "torch" in sys.modules, gc.isenabled(), gc.get_freeze_count() > 0

    node = ray._private.worker._global_node
    for info in node.all_processes.get("monitor", []):  # killed as Ray came up; give it time to be reaped
        try:
            info.process.wait(10)
        except Exception:
            pass
    alive = {kind: [i.process.poll() is None for i in infos] for kind, infos in node.all_processes.items()}
    keeps_idle_worker = actor_gets_an_idle_worker()
    # What Prefect does for a subflow given this runner (as the pipeline does): it enters a duplicate.
    session = node.get_session_dir_path()
    with runner.duplicate() as twin:
        adopted = {"workers_have_env": twin.workers_have_env, "owns_ray": twin._owns_ray,
                   "same_ray": ray._private.worker._global_node.get_session_dir_path() == session,
                   "task": ray.get(env_and_modules.remote())}
    adopted["up_after"] = ray.is_initialized()
    state = {"alive": alive, "task": ray.get(env_and_modules.remote()), "adopted": adopted,
             "timeline": len(ray.timeline()),  # task events: none recorded in a lean Ray
             "env_here": os.environ.get("PREFECT_API_URL"), "metrics_agent_port": ray.nodes()[0]["MetricsAgentPort"],
             "keeps_idle_worker": keeps_idle_worker}
state["down_after"] = not ray.is_initialized()
# A duplicate of a runner that was not entered starts a Ray of its own, as Prefect's flows always did.
fresh = make_task_runner(None, "http://127.0.0.1:9/api").duplicate()
with fresh:
    state["fresh"] = [fresh._owns_ray, fresh.workers_have_env]
# Ray's defaults, for comparison: the same task is recorded.
ray.init(address="local", include_dashboard=False)
state["default_task"] = ray.get(env_and_modules.remote())
state["default_keeps_idle_worker"] = actor_gets_an_idle_worker()
deadline = time.monotonic() + 20  # a worker sends its task events every second
while not (events := len(ray.timeline())) and time.monotonic() < deadline:
    time.sleep(0.5)
state["default_timeline"] = events
ray.shutdown()
print("STATE " + json.dumps(state), flush=True)
"""


@pytest.mark.timeout(300)
def test_local_runner_starts_a_lean_ray_whose_workers_have_the_env_and_torch(no_ray_env, tmp_path):
    """A fresh process, as a flow run: no dashboard head started, no monitor left, the workers set up."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PREFECT_"))}
    env["PYTHONPATH"] = REPO_ROOT
    out = subprocess.run(
        [sys.executable, "-c", LOCAL_RUNNER_SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    state = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("STATE "))[6:])
    # Neither the dashboard head, the autoscaler monitor nor the log monitor was started (the flow-run
    # process reads the workers' output itself).
    assert not {"dashboard", "monitor", "log_monitor"} & set(state["alive"])
    assert state["alive"]["raylet"] == [True]
    # No metrics agent, and none waited for: no ERROR about it after 30 s of a flow run (agent_ports.py).
    assert state["metrics_agent_port"] == -1
    # The worker inherited the flow's Prefect URL from the raylet and had torch preloaded; this process
    # got its environment back after Ray started.
    # It imported that in bulk without the cyclic collector, which is back on (bulk_imports.py); a worker of a Ray
    # with Ray's defaults preloads nothing and freezes nothing.
    assert state["task"] == ["http://127.0.0.1:9/api", True, True, True]
    assert state["default_task"] == [None, False, True, False]
    assert state["env_here"] is None
    # The duplicate Prefect enters for the steps' subflow ran its tasks on that Ray, whose workers have the
    # environment (no runtime_env needed), and left it up; the runner that started Ray stopped it.
    assert state["adopted"] == {
        "workers_have_env": True,
        "owns_ray": False,
        "same_ray": True,
        "task": ["http://127.0.0.1:9/api", True, True, True],
        "up_after": True,
    }
    assert state["down_after"] is True
    assert state["fresh"] == [True, True]
    # No task events in the lean Ray (LEAN_SYSTEM_CONFIG): nothing reads them without a dashboard, and the driver's
    # shutdown waits ~0.2 s to flush them. Ray's defaults record the same task.
    assert state["timeline"] == 0
    assert state["default_timeline"] > 0
    # An idle worker outlives the train step's placement group taking every CPU (flows/task_runner.py
    # IDLE_WORKER_KEEP_MS), so an actor starts on it; with Ray's defaults Ray had ended it and started another.
    assert state["keeps_idle_worker"] is True
    assert state["default_keeps_idle_worker"] is False


def test_a_cluster_runner_prints_the_workers_lines_whole(no_ray_env, monkeypatch):
    """Both flows' cluster runners (training and scoring) come from cluster_task_runner, which wraps Ray's printer
    of the workers' output (tests/unit/test_worker_logs.py shows what the wrapper does)."""
    from ray._private import worker as ray_worker

    from flows.score import ScoreParams, _task_runner

    original = ray_worker.print_worker_logs
    original = getattr(original, "__wrapped__", original)  # an earlier test of this process may have wrapped it
    for make in (
        lambda: make_task_runner("ray://head:10001", API),
        lambda: _task_runner(
            ScoreParams(input_url="in.npy", output_url="out.csv", ray_address="ray://head:10001"), API
        ),
    ):
        monkeypatch.setattr(ray_worker, "print_worker_logs", original)
        runner = make()
        assert runner.address == "ray://head:10001"
        assert getattr(ray_worker.print_worker_logs, "_whole_lines", False)
        assert ray_worker.print_worker_logs.__wrapped__ is original
