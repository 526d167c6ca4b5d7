"""The embedded Ray that fit() starts: lean (no dashboard head, no autoscaler monitor, no log monitor
process, no dashboard agent, a runtime-env agent only once asked for, no torch in the workers of a trainer that does not use it), usable for several fits, workers' output reaches the
driver, and nothing of it outlives the driver's process.

Runs a fresh Python process (no Ray initialised, no RAY_ADDRESS), as a user's script does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, TESTS_DIR, pid_running, processes_whose_command_line
from malloc_probe import PAGES

SCRIPT = r"""
import gc, json, sys
import ray
import trainlib
import bulk_import_probe
from malloc_probe import refaulted_pages
from trainlib._internal.startup.allocator import step_allocations_kept
from trainlib.torch import TorchTrainer


def serializer_libraries():  # which libraries Ray's serialization would import in every process are loaded here
    return sorted(name for name in ("pyarrow", "pydantic", "starlette") if name in sys.modules)


def train_func(config):
    print(f"WORKER_SAYS rank={trainlib.get_context().get_world_rank()} fit={config['fit']}", flush=True)
    trainlib.report({"fit": config["fit"], "torch_loaded": "torch" in sys.modules,
                     "serializer_libraries_loaded": serializer_libraries(), "refaulted": refaulted_pages(),
                     "malloc_kept": step_allocations_kept(),
                     # The worker imported the probe as it unpickled this function: with the collector paused;
                     # now it is on, and the preload's and the unpickling's survivors are frozen.
                     "collector": [bulk_import_probe.COLLECTOR_ON_AT_IMPORT, gc.isenabled(),
                                   gc.get_freeze_count() > 0]})
    print(f"WORKER_ENDS rank={trainlib.get_context().get_world_rank()} fit={config['fit']}")


results, torch_loaded, serializer_libraries_loaded, refaulted, malloc_kept, collector = [], [], [], [], [], []
# The first fit starts Ray: a trainer without a framework has its workers preload no torch. The lean Ray
# then serves a second fit() in the same process, a TorchTrainer's.
for fit, trainer_class in ((1, trainlib.DataParallelTrainer), (2, TorchTrainer)):
    result = trainer_class(train_func, train_loop_config={"fit": fit},
                           scaling_config=trainlib.ScalingConfig(num_workers=2),
                           run_config=trainlib.RunConfig(name=f"fit{fit}", storage_path=sys.argv[1])).fit()
    results.append(result.metrics["fit"])
    torch_loaded.append(result.metrics["torch_loaded"])
    serializer_libraries_loaded.append(result.metrics["serializer_libraries_loaded"])
    refaulted.append(result.metrics["refaulted"])
    malloc_kept.append(result.metrics["malloc_kept"])
    collector.append(result.metrics["collector"])
node = ray._private.worker._global_node
alive = {kind: [info.process.poll() is None for info in infos] for kind, infos in node.all_processes.items()}
# The ports the raylet was given for its agents (agent_ports.py), against the ones the agents wrote once they listened.
import glob, os
from trainlib._internal.startup import embedded_ray
first_ray = embedded_ray._local_ray
given = dict(first_ray.agent_ports.ports)
written = {name: int(open(files[0]).read()) for name in given
           if (files := glob.glob(f"{node.get_session_dir_path()}/{name}_*"))}
raylet_pid = node.all_processes['raylet'][0].process.pid
raylet_cmd = open(f"/proc/{raylet_pid}/cmdline").read().split("\0")
# The raylet's agents: the runtime-env agent's forwarder, and the stand-in in the dashboard agent's place.
import psutil, socket
children = {}
for child in psutil.Process(raylet_pid).children():
    try:
        command = " ".join(child.cmdline())
    except psutil.Error:  # a worker that has just exited and been reaped
        continue
    if command:  # empty: a worker exiting now (a zombie has no command line, whenever it became one)
        children[child.pid] = command
agents = [cmd for cmd in children.values() if not cmd.startswith("ray::") or "Agent" in cmd]
stand_in_pids = [pid for pid, cmd in children.items() if "dashboard_agent_stand_in" in cmd]
forwarder = psutil.Process(next(pid for pid, cmd in children.items() if "runtime_env_agent_on_demand" in cmd))
forwarder_listens = sorted(c.laddr.port for c in forwarder.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN)
# The runtime-env agent starts at the first request for it (runtime_env_agent.py): none in the fits; then a
# task asking for a runtime env gets it, from the agent started then.
agent_before = [" ".join(c.cmdline()) for c in forwarder.children()]


@ray.remote
def env_probe():
    return os.environ.get("TRAINLIB_PROBE")


env_probe_saw = ray.get(env_probe.options(runtime_env={"env_vars": {"TRAINLIB_PROBE": "on"}}).remote(), timeout=300)
agent_after = [" ".join(c.cmdline()).strip() for c in forwarder.children()]
refused = []
for name in ("metrics_export_port",):
    try:
        socket.create_connection(("127.0.0.1", given[name]), timeout=5).close()
    except ConnectionRefusedError:
        refused.append(name)
# No metrics agent (port -1), so the raylet, the GCS and the workers never wait for one: each says so in its log
# at once, instead of retrying for 30 s and then printing an ERROR to the user's console.
metrics_agent_port = ray.nodes()[0]["MetricsAgentPort"]
metrics_logs = {}
for log in glob.glob(f"{node.get_session_dir_path()}/logs/*"):
    if os.path.isfile(log):
        text = open(log, errors="replace").read()
        metrics_logs[os.path.basename(log)] = [words for words in ("Metrics agent not available", "Initializing exporter",
                                                                  "exporter agent") if words in text]
serializer_libraries_loaded.append(serializer_libraries())  # and the driver's
timeline_events = len(ray.timeline())  # task events, which two fits' tasks and actors would have recorded
session_dir = node.get_session_dir_path()
# The user shuts that Ray down; the next fit() starts another, whose workers' output reaches the driver too.
ray.shutdown()
results.append(trainlib.DataParallelTrainer(
    train_func, train_loop_config={"fit": 3}, scaling_config=trainlib.ScalingConfig(num_workers=2),
    run_config=trainlib.RunConfig(name="fit3", storage_path=sys.argv[1])).fit().metrics["fit"])
import threading
readers = [t.name for t in threading.enumerate() if t.name == "trainlib-worker-logs"]
state = {"results": results, "torch_loaded": torch_loaded, "serializer_libraries_loaded": serializer_libraries_loaded,
         "refaulted": refaulted, "malloc_kept": malloc_kept, "collector": collector,
         "driver_collector": [gc.isenabled(), gc.get_freeze_count()],
         "alive": alive, "session_dir": session_dir, "log_readers": len(readers),
         "ports_given": given, "ports_written": written,
         "listen_flag": [arg for arg in raylet_cmd if arg.startswith("--dashboard_agent_listen_port=")],
         "first_ports_released": first_ray.agent_ports._sockets == [], "agents": agents,
         "stand_in_pids": stand_in_pids, "refused": refused, "forwarder_listens": forwarder_listens,
         "agent_before": agent_before, "env_probe_saw": env_probe_saw, "agent_after": agent_after,
         "metrics_agent_port": metrics_agent_port, "metrics_logs": metrics_logs, "timeline_events": timeline_events}
print("STATE " + json.dumps(state), flush=True)
"""


def _run_fresh(tmp_path, source: str, marker: str, *args: str, timeout: float):
    """Run ``source`` as a user's script in a fresh process (no Ray, no RAY_ADDRESS); return its output and
    the JSON it printed after ``marker``."""
    script = tmp_path / "job.py"
    script.write_text(source)
    # RAY_DEDUP_LOGS=0: Ray would fold the ranks' alike lines into one "[repeated 2x]" line.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([REPO_ROOT, TESTS_DIR]),
        "RAY_TMPDIR": "/tmp",
        "RAY_DEDUP_LOGS": "0",
    }
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith(marker))
    return out, json.loads(line[len(marker) :])


def _session_processes(session_dir: str) -> list[str]:
    """Processes still running whose command line names the Ray session (its daemons and workers)."""
    return processes_whose_command_line(lambda cmd: session_dir in cmd or os.path.basename(session_dir) in cmd)


# ~40 s on a quiet machine; minutes under heavy load (the limit is for hangs).
@pytest.mark.timeout(900)
def test_embedded_ray_is_lean_reusable_and_gone_after_exit(tmp_path):
    out, state = _run_fresh(tmp_path, SCRIPT, "STATE ", str(tmp_path / "runs"), timeout=850)
    assert state["results"] == [1, 2, 3]
    assert state["log_readers"] == 1  # the first Ray's reader stopped when the second Ray started
    # Workers import only what their trainer's backend needs: torch costs ~1-3 s of CPU per process.
    assert state["torch_loaded"] == [False, True]
    # Nor pyarrow, pydantic or starlette, which Ray's serialization would import in every process (~50 MB
    # each; lazy_serializers.py): not in the workers of either fit, nor in the driver.
    assert state["serializer_libraries_loaded"] == [[], [], []]
    # A TorchTrainer's workers keep a step's freed memory for the next step (allocator.py): 24 MB allocated
    # again fault nothing in. The torch-free trainer's workers keep glibc's defaults. How many pages those
    # fault in depends on the process's past allocations (glibc's adaptive thresholds: 6,000 in a fresh
    # process, 0 in one CI run), so only the settings are checked there; test_allocator.py compares the
    # two in fresh processes.
    assert state["malloc_kept"] == [False, True]
    # The workers imported in bulk without the cyclic collector (bulk_imports.py): the preload (none but trainlib's
    # own for the first fit, torch for the second) and the training function's modules; then it was back on. The
    # driver, the user's process, is left as it is.
    assert state["collector"] == [[False, True, True], [False, True, True]]
    assert state["driver_collector"] == [True, 0]
    assert state["refaulted"][1] < PAGES / 10, state["refaulted"]
    # The daemons an embedded run never uses were not started (the dashboard head, the autoscaler monitor);
    # the ones it needs still run.
    assert "dashboard" not in state["alive"] and "monitor" not in state["alive"]
    assert state["alive"]["raylet"] == [True] and state["alive"]["gcs_server"] == [True]
    # Nor Ray's log monitor process: a thread of the driver reads the workers' log files (worker_logs.py).
    assert "log_monitor" not in state["alive"]
    # Every worker's print reached the driver, with Ray's prefix, including the last lines of the last
    # fit (printed after its report, without a flush: read and printed at exit, before Ray shut down).
    output = out.stdout + out.stderr
    for fit in (1, 2, 3):
        for rank in (0, 1):
            assert f"WORKER_SAYS rank={rank} fit={fit}" in output
            assert f"WORKER_ENDS rank={rank} fit={fit}" in output
    assert re.search(r"\(TrainWorker pid=\d+\)(\x1b\[0m)? WORKER_SAYS rank=1 fit=2", output), output[-3000:]
    assert "log_monitor.py" not in output  # the reader's own INFO lines stay out of the user's console
    # The raylet was given its agents' ports instead of waiting for each agent to pick one and write it to a
    # file (~0.7 s before the node registers).
    assert set(state["ports_given"]) == {"runtime_env_agent_port", "metrics_export_port"}
    # No agent had started to write a port (the files Ray would wait for): the runtime-env agent's forwarder
    # listened on the very port the raylet was given.
    assert state["ports_written"] == {}
    assert state["forwarder_listens"] == [state["ports_given"]["runtime_env_agent_port"]]
    assert len(state["listen_flag"]) == 1  # the HTTP port too, which Ray itself leaves to the agent's file
    # No dashboard agent (dashboard_agent.py): the raylet runs the runtime-env agent's forwarder and the
    # stand-in, which serves nothing; a connection to the dashboard agent's ports is refused at once, not left
    # hanging.
    assert len(state["agents"]) == 2, state["agents"]
    assert any("runtime_env_agent_on_demand" in agent for agent in state["agents"]), state["agents"]
    # No runtime-env agent while three fits ran (~80 MB and ~0.55 CPU-s spared); then a task's runtime env
    # started it, and the task saw its environment.
    assert state["agent_before"] == []
    assert state["env_probe_saw"] == "on"
    assert state["agent_after"] == ["ray::RuntimeEnvAgent"], state["agent_after"]
    assert not any("dashboard/agent.py" in agent or "DashboardAgent" in agent for agent in state["agents"])
    assert len(state["stand_in_pids"]) == 1
    assert state["refused"] == ["metrics_export_port"]
    # No metrics agent: the node says so (-1), and so do the raylet, the GCS and the workers in their logs; none
    # waits for one (no exporter being initialised), so none prints "Failed to establish connection to the
    # metrics exporter agent" after 30 s, here nor on the console.
    assert state["metrics_agent_port"] == -1
    logs = state["metrics_logs"]
    assert logs["raylet.out"] == logs["gcs_server.out"] == ["Metrics agent not available"], logs
    assert [name for name, words in logs.items() if name.startswith("python-core-worker-") and words] != []
    assert not any("Initializing exporter" in words or "exporter agent" in words for words in logs.values()), logs
    # No task events either (LEAN_SYSTEM_CONFIG): nothing reads them without a dashboard, and the driver's shutdown
    # would wait to flush them. A Ray with them records the fits' tasks (test_cluster_task_runner.py compares).
    assert state["timeline_events"] == 0
    assert "exporter agent" not in output
    assert state["first_ports_released"]  # the first Ray's reservation ended when the user shut it down
    # The driver's fast shutdown left nothing of the session running (bounded wait for the reaping).
    deadline = time.time() + 30
    while _session_processes(state["session_dir"]) and time.time() < deadline:
        time.sleep(0.5)
    assert _session_processes(state["session_dir"]) == []
    assert not any(
        pid_running(pid) for pid in state["stand_in_pids"]
    )  # nor the stand-in, whose command names no session


SERIALIZERS_SCRIPT = r"""
import json, sys
import ray
from trainlib._internal.startup.embedded_ray import ensure_ray

LIBRARIES = ("pyarrow", "pydantic", "starlette")
ensure_ray(preload=())
ray.get(ray.put({"a": 1}))  # this process's serialization context exists from here on
driver_before = [name for name in LIBRARIES if name in sys.modules]


def serializers_at_work():  # import each library, then use Ray's serializer for it in this process
    import pyarrow as pa
    import pydantic  # noqa: F401  (Ray's serializer is for pydantic's v1 ModelField, which it imports)
    from pydantic.v1.fields import ModelField
    from starlette.datastructures import State

    table = pa.table({"x": list(range(1_000_000))})  # 8 MB
    context = ray._private.worker.global_worker.get_serialization_context()
    return {"slice_bytes": context.serialize(table.slice(0, 10)).total_bytes,
            "state_answer": ray.get(ray.put(State({"answer": 42}))).answer,
            "model_field_serializer": ModelField in ray.cloudpickle.CloudPickler.dispatch}


@ray.remote
def in_worker():
    return [name for name in LIBRARIES if name in sys.modules], serializers_at_work()


worker_before, in_the_worker = ray.get(in_worker.remote())
print("SERIALIZERS " + json.dumps({"driver_before": driver_before, "in_the_driver": serializers_at_work(),
                                   "worker_before": worker_before, "in_the_worker": in_the_worker}), flush=True)
"""


@pytest.mark.timeout(300)
def test_serializer_libraries_load_only_when_used_and_then_rays_serializers_for_them_work(tmp_path):
    """The embedded Ray's processes import neither pyarrow, pydantic nor starlette for Ray's serializers; once
    a process imports one, Ray's serializer for it is there: a 10-row slice of an 8 MB Arrow table travels as
    its rows, not its buffers (8,000,379 bytes without the serializers, 636 with them, here); starlette's
    ``State`` travels at all (it recurses without its serializer); pydantic's v1 ``ModelField`` has its own."""
    _, state = _run_fresh(tmp_path, SERIALIZERS_SCRIPT, "SERIALIZERS ", timeout=280)
    assert state["driver_before"] == [] and state["worker_before"] == [], state
    for where in ("in_the_driver", "in_the_worker"):
        assert state[where]["slice_bytes"] < 100_000, state
        assert state[where]["state_answer"] == 42, state
        assert state[where]["model_field_serializer"] is True, state
