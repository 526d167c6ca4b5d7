"""The flow's task runner: prefect-ray's RayTaskRunner on a local Ray or a cluster. Runs in the flow-run process.

Every task runs on a Ray worker whose environment carries this flow's ``PREFECT_API_URL`` (and
nothing secret), so all task runs land in the same Prefect server; ephemeral servers are
switched off there, and trainlib's log records reach the task run logs. On a cluster the
project's code ships with the job (``runtime_env`` ``py_modules``: trainlib, tasks, flows, deployments), so
a node needs Python with the runtime dependencies, not this repository; and before any task
runs, :func:`check_cluster_reach` refuses addresses that nodes on other hosts cannot use.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import ray
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect_ray import RayTaskRunner

from flows.preflight import cluster_address
from tasks.domain.environ import environment
from tasks.domain.reachability import check_reachable

# trainlib's own lean start of a local Ray; the pipeline's local Ray is started by prefect-ray.
from trainlib.startup import (
    WORKER_PRELOAD_MODULES,
    LeanLocalRay,
    lean_local_start,
    lean_system_config,
    print_whole_lines,
)

PROJECT_PACKAGES = ("trainlib", "tasks", "flows", "deployments")  # deployments: the flows' names
RAY_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray for a submitted job's driver
LOG_SEND_TIMEOUT_S = 5.0  # the most a task waits, as it ends, for its log lines to reach the Prefect API
# Ray ends an idle worker once idle workers outnumber the free CPUs and it has idled past this (Ray's default: 1 s).
# The train step's placement group takes every CPU just before its actors ask for workers, so Ray ended the worker
# it had prestarted (torch already imported) in some runs, and both actors waited for fresh workers
# (docs/benchmarks.md, "The pipeline (kept)"). A local Ray lives for one flow run: keep an idle worker that long
# (10 minutes covers a first download from the internet before the train step).
IDLE_WORKER_KEEP_MS = 10 * 60 * 1000

# Ray loaded whole, now. prefect-ray imports it lazily (importlib's LazyLoader), and Prefect imports prefect-ray at
# start-up in a worker's flow-run process (a Prefect collection). A lazy Ray first loaded inside an import of one of
# its submodules (the lean start's ``from ray._private import utils``) gets two ``ray._private`` modules, and
# ``ray.is_initialized()`` fails: "module 'ray._private' has no attribute 'worker'". An attribute read loads it.
RAY_VERSION = ray.__version__


def ray_worker_env(api_url: str) -> dict[str, str]:
    """Environment for every Ray worker: where the Prefect API is, never an ephemeral server, trainlib's logs.

    Only the URL travels; an API key would be a secret, so Prefect Cloud users set it on the
    cluster nodes themselves.
    """
    return {
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib",
    }


def project_modules() -> list[str]:
    """The folders of the project's packages, shipped to every node as ``runtime_env`` ``py_modules``."""
    return [os.path.dirname(os.path.abspath(importlib.import_module(name).__file__)) for name in PROJECT_PACKAGES]


def job_runtime_env() -> dict[str, Any]:
    """The runtime env of the Ray job whose driver this process is (``ray job submit``), else ``{}``."""
    raw = os.environ.get(RAY_JOB_CONFIG_ENV_VAR)
    if not raw:
        return {}
    try:
        return json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}


def run_task_then_send_logs(*args: Any, **kwargs: Any) -> Any:
    """prefect-ray's task body on a Ray worker, then the log lines and events the worker holds for the Prefect API
    sent.

    A worker sends them in batches, every few seconds; the task runner stops Ray, and the workers with it, as the
    flow ends, so the last tasks' lines would be lost (an evaluate step's in one test run). Bounded by
    :data:`LOG_SEND_TIMEOUT_S`.
    """
    try:
        return RayTaskRunner._run_prefect_task(*args, **kwargs)
    finally:
        _quiet_drain_notices()
        # Prefect's services share one registry: this sends the events (the task runs' states) too.
        APILogWorker.drain_all(timeout=LOG_SEND_TIMEOUT_S)


class _DrainNotice(logging.Filter):
    """Drops "Still processing items: N items remaining...", which a service logs when it is drained holding items."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Still processing items")


_DRAIN_NOTICE = _DrainNotice()


def _quiet_drain_notices() -> None:
    # Each service logs under its class's name. After every task it holds items as a rule (its lines, its state
    # events), so the notice would be a WARNING on the user's console for the expected case.
    for service in (APILogWorker, EventsWorker):
        log = logging.getLogger(service.__name__)
        if _DRAIN_NOTICE not in log.filters:
            log.addFilter(_DRAIN_NOTICE)


class LogSendingRayTaskRunner(RayTaskRunner):
    """prefect-ray's runner whose tasks send their log lines before they return (:func:`run_task_then_send_logs`)."""

    _run_prefect_task = staticmethod(run_task_then_send_logs)


class LocalRayTaskRunner(LogSendingRayTaskRunner):
    """prefect-ray's runner on a Ray it starts on this machine, without the daemons a local run never uses.

    As trainlib's embedded Ray: neither the dashboard head (most of ``ray.init``'s time) nor the
    autoscaler monitor is started, which saves their memory and a second of Ray's shutdown at the
    end of every flow run; nor is Ray's log monitor process:
    a thread of the flow-run process, Ray's only driver, reads the workers' output instead.

    ``worker_env`` reaches the workers by inheritance: it is in this process's environment only
    while ``ray.init`` starts the raylet, whose workers inherit it. A ``runtime_env`` with the same
    variables would make Ray start a new worker for it instead of using the ones it prestarts (one
    per CPU, with ``preload`` already imported): a cold worker before the first task, and another
    for each of training's actors.
    """

    def __init__(self, *args: Any, worker_env: Mapping[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.worker_env = dict(worker_env or {})
        self._local_ray: LeanLocalRay | None = None
        # A duplicate of a runner that had started Ray (with worker_env) and keeps it up: it runs the tasks there.
        self._on_started_ray = False

    def duplicate(self) -> LocalRayTaskRunner:
        """A copy, as Prefect enters for a flow run. Of a runner entered already, one that runs the tasks on the Ray
        it started and leaves that Ray up: the pipeline starts Ray before Prefect creates the steps' subflow run, so
        the workers start sooner, and stops it after that run."""
        twin = type(self)(address=self.address, init_kwargs=self.init_kwargs, worker_env=self.worker_env)
        twin._on_started_ray = self._on_started_ray or self._local_ray is not None
        return twin

    def __enter__(self) -> LocalRayTaskRunner:
        with environment(self.worker_env), lean_local_start() as lean:
            super().__enter__()
        if self._owns_ray:
            self._local_ray = lean.started()
        else:
            lean.joined()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self._local_ray is not None:
                self._local_ray.stop()  # the workers' last lines, before Ray shuts down
                self._local_ray = None
        finally:
            super().__exit__(*exc_info)

    @property
    def workers_have_env(self) -> bool:
        """Whether the Ray workers were started with ``worker_env`` (this runner, or the one it duplicates, started
        Ray)."""
        return self._owns_ray or self._on_started_ray


def local_task_runner(
    preload: Iterable[str] = (), worker_env: Mapping[str, str] | None = None, **init_kwargs: Any
) -> LocalRayTaskRunner:
    """A task runner on a new local Ray (``address="local"``: never the last cluster started on this machine).

    ``preload``: modules the raylet's worker processes import as they start (Ray's
    ``preload_python_modules``), so the ones it prestarts, one per CPU, load them while the flow
    prepares instead of in the first task each runs. ``worker_env``: environment variables for
    every worker (see :class:`LocalRayTaskRunner`).
    """
    # Without worker_setup: the pipeline's tasks import Ray's serializers' libraries anyway (lazy_serializers.py).
    system_config = lean_system_config(
        preload, lazy_serializers=False, idle_worker_killing_time_threshold_ms=IDLE_WORKER_KEEP_MS
    )
    if system_config:  # {} with trainlib's start-up layer switched off: prefect-ray's own ray.init
        init_kwargs["_system_config"] = system_config
    return LocalRayTaskRunner(
        address="local", init_kwargs={"include_dashboard": False, **init_kwargs}, worker_env=worker_env
    )


def workers_have_env(task_runner: Any) -> bool:
    """Whether ``task_runner`` started Ray with the workers' environment, so tasks need no ``runtime_env`` for it."""
    return isinstance(task_runner, LocalRayTaskRunner) and task_runner.workers_have_env


def make_task_runner(ray_address: str | None, api_url: str) -> RayTaskRunner:
    """A RayTaskRunner for a local Ray (no address) or a cluster (``ray_address`` or ``$RAY_ADDRESS``).

    On a cluster the runtime environment carries the project's code, so nodes without it run the tasks.
    Inside a Ray job, what the job's runtime env already sets is left to it: Ray refuses to merge a
    field or environment variable given twice, and a job's ``working_dir`` already ships the code.
    """
    address = cluster_address(ray_address)
    job = job_runtime_env()
    env_vars = {k: v for k, v in ray_worker_env(api_url).items() if k not in (job.get("env_vars") or {})}
    runtime_env: dict[str, Any] = {"env_vars": env_vars} if env_vars else {}
    if not address:
        # trainlib's actors need torch and its worker module: the workers Ray prestarts import them at once.
        return local_task_runner(preload=WORKER_PRELOAD_MODULES, worker_env=env_vars)
    if not (job.get("working_dir") or job.get("py_modules")):
        runtime_env["py_modules"] = project_modules()
    return cluster_task_runner(address, runtime_env)


def cluster_task_runner(address: str, runtime_env: Mapping[str, Any]) -> RayTaskRunner:
    """prefect-ray's runner on the Ray cluster at ``address``, every task with ``runtime_env``.

    Ray's printer in this process prints the workers' output beside the flow's log lines: each line in one
    write (``print_whole_lines``), so the two never glue. (A local runner's reader does the same.)
    """
    print_whole_lines()
    return LogSendingRayTaskRunner(address=address, init_kwargs={"runtime_env": dict(runtime_env)})


def check_cluster_reach(
    api_url: str, mlflow_tracking_uri: str, storage_path: str, mirrors: Iterable[str] | None
) -> None:
    """With Ray connected: refuse what nodes on other hosts could not reach (see tasks.domain.reachability)."""
    node_ips = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
    check_reachable(
        node_ips,
        prefect_api_url=api_url,
        mlflow_tracking_uri=mlflow_tracking_uri,
        storage_path=storage_path,
        mirrors=mirrors or (),
    )


def largest_node_cpus(cap: int = 16) -> int:
    """The CPUs of the largest alive node (at most ``cap``), with Ray connected: what one task may take when
    nothing else runs, e.g. the evaluation after training, so it is not left with Ray's default single thread."""
    cpus = [node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")]
    return max(1, min(cap, int(max(cpus, default=1))))
