"""Shared fixtures: a local Ray cluster for the session, free ports, tiny FashionMNIST-format data."""

from __future__ import annotations

import contextlib
import os
import socket
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.join(REPO_ROOT, "tests")  # the shared helper modules (malloc_probe, prefect_helpers...)
# The official FashionMNIST files beside the checkout; FASHION_MNIST_MIRROR names them elsewhere (git worktrees).
FASHION_MNIST_MIRROR = os.environ.get("FASHION_MNIST_MIRROR") or os.path.abspath(
    os.path.join(REPO_ROOT, "..", "shared", "datasets", "fashion-mnist")
)


# Environment for the Prefect servers the tests start: no analytics, and none of the server's
# periodic services that no test uses (the scheduler would fill the database with the weekly
# deployment's future runs; the others poll for late, paused or lost runs). Events, task-run
# recording and automations (triggers) stay on: the tests read them.
PREFECT_TEST_SERVER_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    **{
        f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
        for name in (
            "SCHEDULER",
            "LATE_RUNS",
            "FOREMAN",
            "PAUSE_EXPIRATIONS",
            "CANCELLATION_CLEANUP",
            "REPOSSESSOR",
            "DB_VACUUM",
            "CLEANUP_RECONCILER",
            "EVENT_LOGGER",
        )
    },
}


def process_gone(proc, timeout: float) -> bool:
    """Whether the ``psutil.Process`` ``proc`` exits (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_running(proc.pid):
            return True
        time.sleep(0.05)
    return False


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie, whenever it exits (between two reads of /proc too)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone, or exited between psutil's reads (CI saw it fail a test, 2026-12-06)
        return False


def processes_whose_command_line(match) -> list[str]:
    """``"pid command line"`` (cut at 120 characters) of the running processes whose command line ``match`` accepts."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if match(cmd):
            found.append(f"{proc.info['pid']} {cmd[:120]}")
    return found


_handed_out: set[int] = set()


def run_script(tmp_path, text: str, data_folder: str | None = None, timeout_s: float = 600):
    """Run a training script's ``text`` as ``python script.py`` in a fresh process (its own embedded Ray), in
    ``tmp_path``, with ``TMPDIR`` and ``HOME`` there; ``data_folder``'s FashionMNIST files are first placed where
    ``torchvision.datasets.FashionMNIST(os.path.join(tempfile.gettempdir(), "data"))`` finds them. Returns the
    ``subprocess.CompletedProcess``."""
    import subprocess
    import sys

    from tasks.domain.torchvision_layout import torchvision_layout

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    if data_folder is not None:
        torchvision_layout(data_folder, tmpdir / "data")
    script = tmp_path / "script.py"
    script.write_text(text)
    # RAY_TMPDIR keeps Ray's socket paths short (AF_UNIX paths are limited to 107 bytes).
    env = {
        **os.environ,
        "TMPDIR": str(tmpdir),
        "RAY_TMPDIR": "/tmp",
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": REPO_ROOT,
    }
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def free_port(ip: str = "127.0.0.1") -> int:
    """A port free on ``ip`` now, never one this process handed out before.

    The kernel may give the same free port to two binds in a row while the server meant for the
    first has not bound it yet: a module that starts a Prefect server and then an MLflow server
    saw the second take the first's port ("address already in use").
    """
    while True:
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def controller_on(
    storage,
    make_worker_group=lambda: None,
    *,
    world_size: int = 2,
    checkpoint_config=None,
    failure_config=None,
    callbacks=None,
):
    """A driver's Controller for the run in ``storage``; without a worker group, tests feed it messages directly."""
    from trainlib._internal.execution.controller import Controller
    from trainlib._internal.storage.run_record import RunRecord
    from trainlib.callbacks import RunInfo
    from trainlib.config import CheckpointConfig, FailureConfig

    record = RunRecord(
        name=storage.name,
        storage_path=storage.root,
        trainlib_version="",
        train_loop_config=None,
        scaling_config={},
        checkpoint_config={},
        failure_config={},
    )
    info = RunInfo(
        name=storage.name,
        path=storage.uri(),
        world_size=world_size,
        use_gpu=False,
        train_loop_config=None,
        scaling_config={},
        resumed_from=None,
        record=record,
    )
    return Controller(
        storage=storage,
        make_worker_group=make_worker_group,
        checkpoint_config=checkpoint_config or CheckpointConfig(),
        failure_config=failure_config or FailureConfig(),
        callbacks=callbacks or [],
        run_info=info,
        verbose=False,
    )


_session_lean = None  # what the session's lean Ray keeps in this process (its log reader, its agents' ports)


def start_session_ray() -> None:
    """Start the session's embedded Ray; modules that connect to a cluster of their own call it to restore it.

    Started as lean as trainlib's own embedded Ray (embedded_ray.init_lean_local_ray: no dashboard, monitor,
    log monitor or dashboard agent, the runtime-env agent on demand, no metrics; the workers import Ray's
    serializer add-ons only when used): the suite is CPU-bound, and the tests then run on the Ray that users
    get. The workers preload no torch: a test's actors import what they use. This process (which imports
    Prefect and MLflow, so pydantic and pyarrow, anyway) keeps Ray's serializers as they are."""
    from trainlib._internal.startup.embedded_ray import init_lean_local_ray

    global _session_lean
    stop_session_ray()  # and the reader and ports of the previous one
    lean = init_lean_local_ray(preload=(), num_cpus=4)  # None with the start-up layer off: a stock ray.init
    _session_lean = lean.started() if lean is not None else None


def stop_session_ray() -> None:
    """Shut down whatever Ray this process is connected to, and the session's lean Ray's reader and ports."""
    import ray

    global _session_lean
    ray.shutdown()
    if _session_lean is not None:
        _session_lean.stop()
        _session_lean = None


@contextlib.contextmanager
def cluster_utils_cluster(head_cpus: int, node_cpus: tuple[int, ...] = ()):
    """A ``ray.cluster_utils`` cluster (head, then one node per ``node_cpus``) this process is connected to,
    yielded as (cluster, nodes); the session's embedded Ray comes back after, for the modules that follow."""
    import ray
    from ray.cluster_utils import Cluster

    from trainlib._internal.startup.lean_start import without_unused_daemons

    was_running = ray.is_initialized()
    ray.shutdown()
    with without_unused_daemons():  # the suite is CPU-bound; nothing here uses them
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=cpus) for cpus in node_cpus]
    if nodes:
        cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()
    if was_running:
        start_session_ray()


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray cluster for every test that needs one (4 logical CPUs on the 2-core CI)."""
    import ray

    start_session_ray()
    yield ray
    stop_session_ray()


@pytest.fixture
def fast_retries(monkeypatch):
    """Storage retries without the waits (same number of attempts)."""
    from trainlib._internal import tunables

    monkeypatch.setattr(tunables, "STORAGE_RETRY_BASE_DELAY_S", 0.001)
    monkeypatch.setattr(tunables, "STORAGE_RETRY_MAX_DELAY_S", 0.002)


@pytest.fixture
def storage_path(tmp_path):
    return str(tmp_path / "runs")


# The modules that take the longest, longest first. `make test` runs the suite on three pytest-xdist
# workers, one module at a time each (--dist loadfile --no-loadscope-reorder): starting these first
# keeps one worker from being left alone with a long module at the end (seconds from a quiet run).
LONGEST_FIRST = (
    "cluster/test_cluster.py",  # ~230 s: a `ray start` cluster, two pipeline runs, node losses (long tier)
    "pipeline/test_continuous_training.py",  # ~180 s: two deployments' worth of pipeline runs, triggers
    "e2e/test_score_deployment.py",  # ~170 s
    "data/test_pipeline_data.py",  # ~150 s: five sources through the pipeline
    "e2e/test_pipeline_e2e.py",  # ~90 s in `make test`, ~350 s with its long tests
    "parity/test_elastic.py",
    "tracking/test_mlflow_logger.py",
    "parity/test_torch_utils.py",
    "storage/test_s3.py",
    "storage/test_fault_tolerance.py",
    "model/test_registered_model.py",
    "faults/test_concurrent_runs.py",
    "tracking/test_mlflow_outage.py",
    "storage/test_multinode.py",
    "faults/test_worker_death_uploads.py",
)


# The tiers, by folder: tests/unit runs without Ray, servers or subprocesses (`make test-fast`, under a minute);
# tests/e2e runs the whole pipeline or a deployment; every other folder starts real processes (Ray, servers).
TIER_OF_FOLDER = {"unit": "unit", "e2e": "e2e"}
DEFAULT_TIER = "integration"


def test_tier(nodeid: str) -> str:
    """The tier of the test ``nodeid`` (``tests/<folder>/...``): its folder's."""
    folder = nodeid.removeprefix("tests/").split("/", 1)[0]
    return TIER_OF_FOLDER.get(folder, DEFAULT_TIER)


# Opt-in: the end-to-end checks of over a minute each (marked ``long`` where they are; `make test-long`, which CI
# runs after `make test`), so the default suite stays within its budget. `-m` or TRAINLIB_LONG_TESTS=1 keeps them.
LONG_TESTS_ENV_VAR = "TRAINLIB_LONG_TESTS"


def pytest_collection_modifyitems(config, items):
    if not config.option.markexpr and os.environ.get(LONG_TESTS_ENV_VAR) != "1":
        long = [item for item in items if item.get_closest_marker("long")]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if not item.get_closest_marker("long")]

    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    for item in items:
        tier = test_tier(item.nodeid)
        item.add_marker(tier)
        if tier == "e2e":  # an end-to-end test starts real processes too
            item.add_marker(DEFAULT_TIER)
    items.sort(key=rank)  # stable: the order within a module, and of the other modules, is kept


class UnitTierError(AssertionError):
    """A test of tests/unit started a process or a Ray: it belongs in an integration folder."""


@pytest.fixture(autouse=True)
def _unit_tier_starts_nothing(request, monkeypatch):
    """In tests/unit, starting a subprocess or Ray fails the test, so the tier stays fast and pure."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import subprocess

    def refuse(*args, **kwargs):
        raise UnitTierError(f"{request.node.nodeid} starts a process or Ray: move it out of tests/unit")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    import ray

    monkeypatch.setattr(ray, "init", refuse)
    yield
