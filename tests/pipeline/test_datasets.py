"""Tests of the data-set domain code (registry, fetch, idx files, staging, torchvision layout): mirrors over real local HTTP, local folders, moto S3; no internet."""

from __future__ import annotations

import gzip
import http.server
import logging
import os
import pickle
import shutil
import struct
import threading

import pytest
import torch
from conftest import free_port

from tasks.domain.dataset_fetch import fetch_dataset
from tasks.domain.dataset_registry import DATASETS, get_dataset_spec
from tasks.domain.generated_dataset import write_idx_dataset
from tasks.domain.idx_files import load_fashion_mnist_split
from tasks.domain.mirror_fetch import MIRRORS_ENV_VAR, DatasetDownloadError
from tasks.domain.staging import stage_dataset
from tasks.domain.torchvision_layout import torchvision_layout

FILES = [f for f, _ in DATASETS["fashion-mnist"].files]
OFFICIAL = "/work/shared/datasets/fashion-mnist"
FAST = {"backoff_s": 0.01, "timeout_s": 5.0}


@pytest.fixture(autouse=True)
def _no_env_mirrors(monkeypatch):
    monkeypatch.delenv(MIRRORS_ENV_VAR, raising=False)


@pytest.fixture
def generated(tmp_path):
    """A generated data set in a mirror folder: (folder, md5s)."""
    folder = tmp_path / "mirror" / "good"
    md5s = write_idx_dataset(folder, n_train=50, n_test=20, seed=3)
    return folder, md5s


class _Server:
    def __init__(self, root):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                if self.path.startswith("/busy/"):  # an overloaded server, every time
                    self.send_error(503)
                    return
                if self.path.startswith("/flaky/"):  # busy once per file, then serves /good/
                    if server.requests.count(self.path) == 1:
                        self.send_error(503)
                        return
                    self.path = "/good/" + self.path[len("/flaky/") :]
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def http_mirrors(tmp_path, generated):
    """An HTTP server on 127.0.0.1 with /good/ (right files), /corrupt/ (one file altered), /empty/."""
    _, md5s = generated
    root = tmp_path / "mirror"
    corrupt = root / "corrupt"
    shutil.copytree(root / "good", corrupt)
    data = bytearray((corrupt / FILES[0]).read_bytes())
    data[-10] ^= 0xFF
    (corrupt / FILES[0]).write_bytes(bytes(data))
    (root / "empty").mkdir()
    server = _Server(root)
    yield server, md5s
    server.stop()


def refused_url() -> str:
    return f"http://127.0.0.1:{free_port()}/"


# -- registry ----------------------------------------------------------------------


def test_registry_holds_fashion_mnist_and_mnist():
    fm = get_dataset_spec("fashion-mnist")
    assert dict(fm.files)["train-images-idx3-ubyte.gz"] == "8d4fb7e6c68d591d4c3dfef9ec88bf0d"
    assert "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/" in fm.mirrors
    mnist = get_dataset_spec("mnist")
    assert dict(mnist.files)["t10k-labels-idx1-ubyte.gz"] == "ec29112dd5afa0611ce80d1b7f02629c"
    assert mnist.mirrors[0] == "https://ossci-datasets.s3.amazonaws.com/mnist/"


def test_registry_matches_torchvision():
    from torchvision.datasets import MNIST, FashionMNIST

    assert tuple(DATASETS["mnist"].files) == tuple(MNIST.resources)
    assert tuple(DATASETS["fashion-mnist"].files) == tuple(FashionMNIST.resources)
    assert set(FashionMNIST.mirrors) <= set(DATASETS["fashion-mnist"].mirrors)


def test_unknown_dataset_lists_known_names(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown data set 'cifar'.*'fashion-mnist', 'mnist'"):
        fetch_dataset("cifar", tmp_path)


def test_bad_md5s_argument_is_rejected(tmp_path, generated):
    folder, md5s = generated
    with pytest.raises(ValueError, match="exactly the files"):
        fetch_dataset("fashion-mnist", tmp_path, [folder], md5s={FILES[0]: md5s[FILES[0]]})
    with pytest.raises(ValueError, match="not an md5"):
        fetch_dataset("fashion-mnist", tmp_path, [folder], md5s={**md5s, FILES[0]: "xyz"})


# -- fetching from local mirrors ---------------------------------------------------


def test_write_idx_dataset_is_deterministic(tmp_path):
    a = write_idx_dataset(tmp_path / "a", 10, 5, seed=1)
    b = write_idx_dataset(tmp_path / "b", 10, 5, seed=1)
    c = write_idx_dataset(tmp_path / "c", 10, 5, seed=2)
    assert a == b != c
    assert list(a) == FILES


def test_fetch_from_local_folder_then_cache_hit(tmp_path, generated):
    folder, md5s = generated
    cache = tmp_path / "cache"
    files = fetch_dataset("fashion-mnist", cache, [str(folder)], md5s=md5s)
    assert files.downloaded == tuple(FILES) and files.cached == ()
    assert files.folder == str(cache / "fashion-mnist")
    for name in FILES:
        assert open(files.paths[name], "rb").read() == (folder / name).read_bytes()
    assert not [p for p in os.listdir(files.folder) if p.endswith(".part")]

    again = fetch_dataset("fashion-mnist", cache, [str(folder)], md5s=md5s)
    assert again.downloaded == () and again.cached == tuple(FILES)


def test_fetch_from_file_url(tmp_path, generated):
    folder, md5s = generated
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [folder.as_uri()], md5s=md5s)
    assert files.downloaded == tuple(FILES)
    assert files.sources[FILES[0]] == folder.as_uri() + "/" + FILES[0]


def test_corrupt_cached_file_is_downloaded_again(tmp_path, generated):
    folder, md5s = generated
    cache = tmp_path / "cache"
    files = fetch_dataset("fashion-mnist", cache, [folder], md5s=md5s)
    with open(files.paths[FILES[1]], "ab") as f:
        f.write(b"junk")
    again = fetch_dataset("fashion-mnist", cache, [folder], md5s=md5s)
    assert again.downloaded == (FILES[1],)
    assert set(again.cached) == set(FILES) - {FILES[1]}


# -- fetching over HTTP ------------------------------------------------------------


def test_http_first_mirror_refused_second_works(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    dead = refused_url()
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [dead, server.url + "/good/"], md5s=md5s, **FAST)
    assert files.downloaded == tuple(FILES)
    assert all(url.startswith(server.url + "/good/") for url in files.sources.values())
    assert sorted(server.requests) == sorted(f"/good/{f}" for f in FILES)


def test_http_corrupt_mirror_falls_back(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    files = fetch_dataset(
        "fashion-mnist", tmp_path / "cache", [server.url + "/corrupt", server.url + "/good"], md5s=md5s, **FAST
    )
    assert files.sources[FILES[0]] == f"{server.url}/good/{FILES[0]}"
    assert files.sources[FILES[1]] == f"{server.url}/corrupt/{FILES[1]}"
    assert _md5(files.paths[FILES[0]]) == md5s[FILES[0]]


def test_http_missing_file_falls_back(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    files = fetch_dataset(
        "fashion-mnist", tmp_path / "cache", [server.url + "/empty/", server.url + "/good/"], md5s=md5s, **FAST
    )
    assert files.downloaded == tuple(FILES)
    # A 404 is not retried: one request per file on /empty/.
    assert sum(r.startswith("/empty/") for r in server.requests) == len(FILES)


def test_http_server_errors_are_retried(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [server.url + "/flaky/"], md5s=md5s, **FAST)
    assert files.downloaded == tuple(FILES)
    # A 503 is retried: two requests per file, the second one served.
    assert sorted(server.requests) == sorted(f"/flaky/{f}" for f in FILES for _ in range(2))


def test_http_server_busy_everywhere_is_a_transient_failure(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset(
            "fashion-mnist",
            tmp_path / "cache",
            [server.url + "/busy/", server.url + "/empty/"],
            md5s=md5s,
            attempts_per_mirror=2,
            **FAST,
        )
    assert info.value.attempts == (
        (f"{server.url}/busy/{FILES[0]}", "HTTP 503 Service Unavailable (after 2 attempt(s))"),
        (f"{server.url}/empty/{FILES[0]}", "HTTP 404 File not found"),
    )
    assert server.requests == [f"/busy/{FILES[0]}"] * 2 + [f"/empty/{FILES[0]}"]


def test_http_corrupt_everywhere_names_file_and_md5s(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    cache = tmp_path / "cache"
    mirrors = [server.url + "/corrupt/", server.url + "/corrupt/"]
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset("fashion-mnist", cache, mirrors, md5s=md5s, **FAST)
    err = info.value
    actual = _md5(tmp_path / "mirror" / "corrupt" / FILES[0])
    text = str(err)
    assert FILES[0] in text and md5s[FILES[0]] in text and actual in text
    assert f"{server.url}/corrupt/{FILES[0]}" in text
    assert "checksum mismatch" in text and "md5s=" in text
    assert err.filename == FILES[0] and err.dataset == "fashion-mnist" and len(err.attempts) == 2
    # Nothing half-written stays in the cache.
    assert os.listdir(cache / "fashion-mnist") == []


def test_all_mirrors_unreachable_lists_every_url(tmp_path, generated):
    _, md5s = generated
    dead = [refused_url(), refused_url()]
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset("fashion-mnist", tmp_path / "cache", dead, md5s=md5s, attempts_per_mirror=2, **FAST)
    text = str(info.value)
    for url in dead:
        assert url + FILES[0] in text
    assert text.count("Connection refused") >= 2 and "after 2 attempt(s)" in text
    assert MIRRORS_ENV_VAR in text
    assert [url for url, _ in info.value.attempts] == [u + FILES[0] for u in dead]


def test_second_call_makes_no_http_request(tmp_path, http_mirrors):
    server, md5s = http_mirrors
    cache = tmp_path / "cache"
    fetch_dataset("fashion-mnist", cache, [server.url + "/good/"], md5s=md5s, **FAST)
    assert len(server.requests) == len(FILES)
    server.requests.clear()
    again = fetch_dataset("fashion-mnist", cache, [server.url + "/good/"], md5s=md5s, **FAST)
    assert again.downloaded == () and again.cached == tuple(FILES)
    assert server.requests == []


def test_mirrors_from_environment(tmp_path, http_mirrors, monkeypatch):
    server, md5s = http_mirrors
    monkeypatch.setenv(MIRRORS_ENV_VAR, f"{refused_url()}, {server.url}/good/")
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", md5s=md5s, **FAST)
    assert files.downloaded == tuple(FILES)
    assert files.sources[FILES[0]] == f"{server.url}/good/{FILES[0]}"


def test_credentials_in_urls_are_masked(tmp_path, generated):
    _, md5s = generated
    port = free_port()
    url = f"http://user:hunter2-secret@127.0.0.1:{port}/data/?token=also-secret"
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset("fashion-mnist", tmp_path / "cache", [url], md5s=md5s, attempts_per_mirror=1, **FAST)
    text = str(info.value) + repr(info.value.attempts)
    assert "hunter2-secret" not in text and "also-secret" not in text
    assert f"user:[REDACTED]@127.0.0.1:{port}" in text and "token=[REDACTED]" in text


def test_error_is_picklable(tmp_path, generated):
    _, md5s = generated
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset("fashion-mnist", tmp_path / "cache", [refused_url()], md5s=md5s, attempts_per_mirror=1, **FAST)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.attempts == info.value.attempts
    assert isinstance(copy, RuntimeError)


# -- staging -----------------------------------------------------------------------


def test_stage_to_local_folder_skips_same_size(tmp_path, generated):
    folder, md5s = generated
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [folder], md5s=md5s)
    url = stage_dataset(files, tmp_path / "storage")
    assert url == str(tmp_path / "storage" / "fashion-mnist")
    for name in FILES:
        assert _md5(os.path.join(url, name)) == md5s[name]
    mtimes = {n: os.stat(os.path.join(url, n)).st_mtime_ns for n in FILES}
    assert stage_dataset(files, tmp_path / "storage") == url
    assert {n: os.stat(os.path.join(url, n)).st_mtime_ns for n in FILES} == mtimes
    # Workers fetch the staged copy into their own cache.
    worker = fetch_dataset("fashion-mnist", tmp_path / "node", [url], md5s=files.md5s)
    assert worker.downloaded == tuple(FILES)


@pytest.fixture
def s3_server(monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value-42")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="runs")
    yield endpoint
    server.stop()


def test_stage_to_s3_and_fetch_back(tmp_path, generated, s3_server, caplog):
    import boto3

    folder, md5s = generated
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [folder], md5s=md5s)
    options = {"client_kwargs": {"endpoint_url": s3_server}, "skip_instance_cache": True}
    url = stage_dataset(files, "s3://runs/datasets/", options)
    assert url == "s3://runs/datasets/fashion-mnist"
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="runs")["Contents"]}
    assert listed == {f"datasets/fashion-mnist/{n}": os.path.getsize(files.paths[n]) for n in FILES}

    with caplog.at_level(logging.INFO, logger="trainlib"):
        stage_dataset(files, "s3://runs/datasets", options)
    assert "uploaded none" in caplog.text

    # A worker node fetches the staged copy through fsspec, md5-verified.
    worker = fetch_dataset("fashion-mnist", tmp_path / "node", [url], md5s=files.md5s, storage_options=options, **FAST)
    assert worker.downloaded == tuple(FILES)
    assert worker.sources[FILES[0]] == f"{url}/{FILES[0]}"


def test_stage_error_names_file_and_hides_secrets(tmp_path, generated, s3_server):
    folder, md5s = generated
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [folder], md5s=md5s)
    options = {
        "client_kwargs": {"endpoint_url": s3_server},
        "skip_instance_cache": True,
        "key": "AKIAFAKEFAKEFAKE",
        "secret": "very-secret-value-42",
    }
    with pytest.raises(DatasetDownloadError) as info:
        stage_dataset(files, "s3://no-such-bucket/datasets", options)
    text = str(info.value)
    assert FILES[0] in text and "s3://no-such-bucket/datasets/fashion-mnist" in text
    assert "very-secret-value-42" not in text and "AKIAFAKEFAKEFAKE" not in text


# -- reading -----------------------------------------------------------------------


def test_load_split_reads_generated_values(tmp_path):
    folder = tmp_path / "data"
    write_idx_dataset(folder, n_train=30, n_test=12, seed=7)
    images, labels = load_fashion_mnist_split(folder, train=True)
    assert images.shape == (30, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (30,) and labels.dtype == torch.int64
    with gzip.open(folder / "train-images-idx3-ubyte.gz") as f:
        raw = f.read()
    assert struct.unpack(">IIII", raw[:16]) == (0x803, 30, 28, 28)
    assert images.flatten().tolist() == list(raw[16:])
    with gzip.open(folder / "train-labels-idx1-ubyte.gz") as f:
        raw = f.read()
    assert labels.tolist() == list(raw[8:]) and 0 <= labels.min() and labels.max() <= 9
    # The class band: rows [1 + 2k, 7 + 2k) are bright for label k.
    k = int(labels[0])
    assert images[0, 1 + 2 * k : 7 + 2 * k].min() >= 160 and images[0, 0].max() < 64

    test_images, test_labels = load_fashion_mnist_split(folder, train=False, limit=5)
    full_images, full_labels = load_fashion_mnist_split(folder, train=False)
    assert test_images.shape == (5, 28, 28) and torch.equal(test_images, full_images[:5])
    assert torch.equal(test_labels, full_labels[:5]) and full_labels.shape == (12,)


def test_load_rejects_bad_magic_and_truncation(tmp_path):
    folder = tmp_path / "data"
    write_idx_dataset(folder, n_train=4, n_test=4)
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    images = folder / "t10k-images-idx3-ubyte.gz"
    labels.write_bytes(gzip.compress(struct.pack(">II", 0x803, 4) + b"\0" * 4))
    with pytest.raises(ValueError, match=r"not an idx label file: magic number 0x00000803.*fetch_dataset"):
        load_fashion_mnist_split(folder, train=False)
    write_idx_dataset(folder, n_train=4, n_test=4)
    images.write_bytes(images.read_bytes()[:-30])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz is corrupt"):
        load_fashion_mnist_split(folder, train=False)
    images.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="corrupt"):
        load_fashion_mnist_split(folder, train=False)
    with pytest.raises(ValueError, match="limit"):
        load_fashion_mnist_split(folder, train=True, limit=-1)
    with pytest.raises(FileNotFoundError, match="fetch_dataset"):
        load_fashion_mnist_split(tmp_path / "nowhere", train=True)


def test_torchvision_layout_loads_without_network(tmp_path, monkeypatch):
    import torchvision
    import torchvision.datasets.mnist as tv_mnist

    def no_download(*args, **kwargs):
        raise AssertionError("torchvision tried to download")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", no_download)
    folder = tmp_path / "data"
    write_idx_dataset(folder, n_train=40, n_test=10, seed=5)
    raw = torchvision_layout(folder, tmp_path / "tv")
    assert raw == str(tmp_path / "tv" / "FashionMNIST" / "raw")
    assert sorted(os.listdir(raw)) == sorted(f[: -len(".gz")] for f in FILES)
    train = torchvision.datasets.FashionMNIST(str(tmp_path / "tv"), train=True, download=True)
    test = torchvision.datasets.FashionMNIST(str(tmp_path / "tv"), train=False, download=True)
    assert len(train) == 40 and len(test) == 10
    images, labels = load_fashion_mnist_split(folder, train=True)
    assert torch.equal(train.data, images) and torch.equal(train.targets, labels)
    # A second call keeps the files.
    before = os.stat(os.path.join(raw, "train-images-idx3-ubyte")).st_mtime_ns
    torchvision_layout(folder, tmp_path / "tv")
    assert os.stat(os.path.join(raw, "train-images-idx3-ubyte")).st_mtime_ns == before


# -- the real official files -------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir(OFFICIAL), reason=f"{OFFICIAL} (official FashionMNIST files) missing")
def test_official_fashion_mnist_files(tmp_path):
    files = fetch_dataset("fashion-mnist", tmp_path / "cache", [OFFICIAL])
    assert files.downloaded == tuple(FILES)  # registry md5s matched
    images, labels = load_fashion_mnist_split(files.folder, train=False)
    assert images.shape == (10000, 28, 28) and labels.shape == (10000,)
    assert torch.bincount(labels).tolist() == [1000] * 10
    images, labels = load_fashion_mnist_split(files.folder, train=True, limit=100)
    assert images.shape == (100, 28, 28) and labels.shape == (100,)


def _md5(path) -> str:
    import hashlib

    return hashlib.md5(open(path, "rb").read()).hexdigest()
