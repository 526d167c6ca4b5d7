"""Training on S3 storage: moto's S3 server over HTTP on 127.0.0.1, real Ray workers, s3fs.

The endpoint and fake credentials are in the environment before this module's Ray
starts, so the workers find them as they would on a real cluster. The server is
stopped during uploads to show that the last committed checkpoint stays readable and
that a run recovers when S3 returns or fails with a clear StorageError. The last
test greps every object, the Ray logs and every message for the credentials.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import pytest
from conftest import free_port, start_session_ray
from storage_helpers import expected_w, resumable_train_func

import trainlib
from tasks.domain.environ import environment
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.integration

ACCESS_KEY = "AKIATRAINLIBFAKE" + uuid.uuid4().hex[:8].upper()
SECRET_KEY = "trainlib-secret-" + uuid.uuid4().hex
BUCKET = "trainlib-test"
EPOCHS = 6
# Fail fast while S3 is down: one botocore attempt, short connect timeout (trainlib retries on top).
FAST_FAIL = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 5, "retries": {"max_attempts": 1}}}

# Every message and error text the tests saw, grepped for the credentials at the end.
SEEN_TEXT: list[str] = []


class S3Server:
    """moto's threaded S3 server; its data outlives a stop/start on the same port."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._cls = ThreadedMotoServer
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = None

    def start(self):
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        self.server.stop()
        self.server = None


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import ray

    server = S3Server()
    server.start()
    fake_credentials = {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    import s3fs

    with environment(fake_credentials):
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(BUCKET)
        # The workers must inherit the environment: (re)start Ray after setting it.
        was_running = ray.is_initialized()
        if was_running:
            ray.shutdown()
        start_session_ray()
        logs_dir = ray._private.worker._global_node.get_logs_dir_path()
        yield server, logs_dir
        ray.shutdown()
    s3fs.S3FileSystem.clear_instance_cache()
    if server.server is not None:
        server.stop()
    if was_running:  # leave Ray as the session fixture had it, for the modules after this one
        start_session_ray()


@pytest.fixture(autouse=True)
def record_logs(caplog):
    caplog.set_level(logging.INFO)
    yield
    SEEN_TEXT.append(caplog.text)


def s3_fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def fit(name, config, max_failures=0, storage_options=None, storage_path=f"s3://{BUCKET}/runs", workers=2, **kwargs):
    return TorchTrainer(
        resumable_train_func,
        train_loop_config={"epochs": EPOCHS, "ckpt_every": 2, **config},
        scaling_config=trainlib.ScalingConfig(num_workers=workers),
        run_config=trainlib.RunConfig(
            name=name,
            storage_path=storage_path,
            storage_options=storage_options,
            failure_config=trainlib.FailureConfig(max_failures=max_failures),
            **kwargs,
        ),
    ).fit()


def read_with_pyarrow(result):
    """What Ray Train users do with a Result: read its files through result.filesystem and the paths as given."""
    import io

    import pyarrow.fs
    import torch

    assert isinstance(result.filesystem, pyarrow.fs.FileSystem)
    assert isinstance(result.checkpoint.filesystem, pyarrow.fs.FileSystem)
    with result.filesystem.open_input_stream(f"{result.path}/metrics.jsonl") as f:
        rows = f.read().decode().splitlines()
    with result.checkpoint.filesystem.open_input_stream(f"{result.checkpoint.path}/state.pt") as f:
        state = torch.load(io.BytesIO(f.read()))
    return len(rows), state["epoch"]


def test_uninterrupted_run_on_s3(s3):
    result = fit("plain", {})
    # As Ray Train gives them: the path inside the filesystem, no scheme; the URL for trainlib's readers.
    assert result.path == f"{BUCKET}/runs/plain" and result.uri == f"s3://{BUCKET}/runs/plain"
    assert result.checkpoint.path == f"{BUCKET}/runs/plain/checkpoint_{EPOCHS:06d}"
    assert read_with_pyarrow(result) == (EPOCHS, EPOCHS)
    assert result.metrics["w"] == expected_w(EPOCHS, 2)
    fs = s3_fs()
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/runs/plain"))
    assert names == [
        "checkpoint_000002",
        "checkpoint_000004",
        "checkpoint_000006",
        "metrics.jsonl",
        "trainer.pkl",
        "trainlib_lease_000001.json",
        "trainlib_run.json",
    ]
    # Read back from S3 by a fresh reader, checkpoint files included.
    again = trainlib.Result.from_path(result.uri)
    assert again.metrics == result.metrics and len(again.metrics_dataframe) == EPOCHS
    import torch

    with again.checkpoint.as_directory() as folder:
        assert torch.load(os.path.join(folder, "state.pt"))["epoch"] == EPOCHS
        assert not os.path.exists(os.path.join(folder, ".trainlib_commit.json"))


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_failure_with_one_restart_resumes_on_s3(s3, mode):
    result = fit(f"recover-{mode}", {"fail": mode, "fail_epoch": 5, "fail_rank": 1}, max_failures=1)
    df = result.metrics_dataframe
    assert result.metrics["epoch"] == EPOCHS and result.metrics["w"] == expected_w(EPOCHS, 2)
    assert list(df[df["attempt"] == 1]["start_epoch"].unique()) == [5]


def test_failure_without_restarts_on_s3_names_rank_and_cause(s3):
    with pytest.raises(trainlib.TrainingFailedError) as info:
        fit("raise-0", {"fail": "raise", "fail_epoch": 3, "fail_rank": 1})
    SEEN_TEXT.append(str(info.value))
    assert info.value.failures[0].rank == 1
    assert "injected failure at epoch 3" in info.value.failures[0].cause
    failed = trainlib.Result.from_path(f"s3://{BUCKET}/runs/raise-0")
    assert failed.error is not None and failed.checkpoint.uri.endswith("checkpoint_000002")
    # restore() continues it from S3, with the failure switched off.
    result = TorchTrainer.restore(
        f"s3://{BUCKET}/runs/raise-0", train_loop_config={"epochs": EPOCHS, "ckpt_every": 2}
    ).fit()
    assert result.metrics["w"] == expected_w(EPOCHS, 2)
    assert set(result.metrics_dataframe[result.metrics_dataframe["attempt"] == 1]["start_epoch"]) == {3}


def test_endpoint_override_in_the_storage_url_is_used(s3, monkeypatch):
    """Ray Train's documented way to reach MinIO or any S3-compatible store: the endpoint in the URL's query. The
    environment's endpoint points nowhere, in the driver and the workers, so only the URL's can reach the store."""
    import pyarrow.fs

    server, _ = s3
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    url = f"s3://{BUCKET}/runs-endpoint?endpoint_override={server.endpoint}&region=us-east-1"
    result = fit(
        "endpoint",
        {"epochs": 2},
        storage_path=url,
        workers=1,
        worker_runtime_env={"env_vars": {"AWS_ENDPOINT_URL": dead}},
    )
    assert result.path == f"{BUCKET}/runs-endpoint/endpoint"
    assert isinstance(result.filesystem, pyarrow.fs.S3FileSystem)  # pyarrow's own, from the URL, as in Ray Train
    assert read_with_pyarrow(result) == (2, 2)
    # The URLs trainlib gives back carry the endpoint: they read the run back without it in the environment.
    assert result.uri == f"s3://{BUCKET}/runs-endpoint/endpoint?endpoint_override={server.endpoint}&region=us-east-1"
    again = trainlib.Result.from_path(result.uri)
    assert again.metrics == result.metrics and again.checkpoint.uri == result.checkpoint.uri
    import torch

    with trainlib.Checkpoint.from_uri(result.checkpoint.uri).as_directory() as folder:
        assert torch.load(os.path.join(folder, "state.pt"))["epoch"] == 2


def test_a_bad_query_parameter_is_one_clear_error(s3):
    with pytest.raises(trainlib.StorageError, match="RunConfig.storage_path=.*bogus"):
        fit("bogus", {"epochs": 1}, storage_path=f"s3://{BUCKET}/runs?bogus=1")


@pytest.mark.parametrize("form", ["pyarrow_s3", "pyarrow_over_s3fs"])
def test_a_pyarrow_storage_filesystem_gives_rays_path_and_filesystem(s3, form):
    import pyarrow.fs

    server, _ = s3
    if form == "pyarrow_s3":
        filesystem = pyarrow.fs.S3FileSystem(endpoint_override=server.endpoint, region="us-east-1")
    else:
        filesystem = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(s3_fs()))
    result = fit(form, {"epochs": 2}, storage_path=f"{BUCKET}/runs-{form}", storage_filesystem=filesystem, workers=1)
    assert result.path == f"{BUCKET}/runs-{form}/{form}" and result.filesystem is filesystem
    assert result.checkpoint.path == f"{BUCKET}/runs-{form}/{form}/checkpoint_000002"
    assert type(result.checkpoint.filesystem) is type(filesystem)
    assert read_with_pyarrow(result) == (2, 2)
    again = trainlib.Result.from_path(result.path, storage_filesystem=filesystem)
    assert again.metrics == result.metrics and again.path == result.path


def wait_for_object(path, timeout=120):
    fs = s3_fs()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fs.invalidate_cache()
        if fs.exists(path):
            return
        time.sleep(0.05)
    raise TimeoutError(path)


def run_in_thread(func):
    box = {}

    def target():
        try:
            box["result"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_s3_outage_during_uploads_recovers_when_s3_returns(s3):
    server, _ = s3
    config = {"ckpt_every": 1, "payload_bytes": 4 << 20, "sleep_s": 0.3}
    thread, box = run_in_thread(lambda: fit("outage-recover", config, max_failures=3))
    wait_for_object(f"{BUCKET}/runs/outage-recover/checkpoint_000002/.trainlib_commit.json")
    server.stop()  # the next uploads (checkpoint 3, 4 MB) hit a dead endpoint
    time.sleep(2.0)
    server.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.metrics["epoch"] == EPOCHS and result.metrics["w"] == expected_w(EPOCHS, 2)
    committed = [c for c, _ in result.best_checkpoints]
    # Ray's order without a score attribute: report order, so the latest is last.
    assert [c.uri.rsplit("_", 1)[-1] for c in committed][-1] == f"{EPOCHS:06d}"


def test_s3_outage_that_lasts_fails_with_a_storage_error_and_keeps_the_last_checkpoint(s3):
    server, _ = s3
    config = {"ckpt_every": 1, "payload_bytes": 4 << 20, "sleep_s": 0.3}
    thread, box = run_in_thread(lambda: fit("outage-fail", config, max_failures=0, storage_options=FAST_FAIL))
    wait_for_object(f"{BUCKET}/runs/outage-fail/checkpoint_000002/.trainlib_commit.json")
    server.stop()
    thread.join(timeout=300)
    server.start()
    assert not thread.is_alive()
    error = box.get("error")
    assert error is not None, box
    text = str(error)
    SEEN_TEXT.append(text)
    assert isinstance(error, trainlib.StorageError) or "StorageError" in text, text
    assert "reachable" in text and f"127.0.0.1:{server.port}" in text, text
    # S3 is back: the run reads back with a valid, complete last checkpoint.
    result = trainlib.Result.from_path(f"s3://{BUCKET}/runs/outage-fail")
    assert result.checkpoint is not None
    last = int(result.checkpoint.uri.rsplit("_", 1)[-1])
    assert last >= 2
    import torch

    with result.checkpoint.as_directory() as folder:
        assert torch.load(os.path.join(folder, "state.pt"))["epoch"] == last
        assert os.path.getsize(os.path.join(folder, "payload.bin")) == 4 << 20
    # And the same name continues it to the end.
    resumed = fit("outage-fail", {"ckpt_every": 1})
    assert resumed.metrics["w"] == expected_w(EPOCHS, 2)
    assert resumed.metrics_dataframe["start_epoch"].iloc[-1] == last + 1


def test_no_credential_in_any_object_log_or_message(s3):
    _, logs_dir = s3
    fs = s3_fs()
    checked = 0
    for path in fs.find(BUCKET):
        data = fs.cat_file(path)
        assert ACCESS_KEY.encode() not in data and SECRET_KEY.encode() not in data, path
        checked += 1
    assert checked > 5
    for folder, _dirs, files in os.walk(logs_dir):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            assert ACCESS_KEY.encode() not in data and SECRET_KEY.encode() not in data, name
    assert SEEN_TEXT and any("trainlib" in t or "step" in t for t in SEEN_TEXT)
    for text in SEEN_TEXT:
        assert ACCESS_KEY not in text and SECRET_KEY not in text
