"""Downloads are bounded: a mirror that streams without end stops at the bound with a clear error, and no temporary
file is left (a killed fetch's is swept by the next one)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest
from conftest import free_port

from tasks.domain.dataset_fetch import fetch_dataset
from tasks.domain.generated_dataset import write_idx_dataset
from tasks.domain.mirror_fetch import DatasetDownloadError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = {"backoff_s": 0.01, "timeout_s": 5.0, "attempts_per_mirror": 1}


@pytest.fixture(scope="module")
def endless():
    """Bytes without end and no Content-Length (with one, http.client reads no further than announced)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(100_000):  # up to ~6 GB: far past any bound under test
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass  # the client stopped reading

        def log_message(self, *args):
            pass

    port = free_port()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    httpd.shutdown()


def _md5s(tmp_path):
    return write_idx_dataset(tmp_path / "generated", n_train=10, n_test=10, seed=0)


def test_an_endless_mirror_stops_at_the_bound_and_leaves_no_file(endless, tmp_path):
    with pytest.raises(DatasetDownloadError) as info:
        fetch_dataset(
            "fashion-mnist",
            tmp_path / "cache",
            [f"{endless}/forever/"],
            md5s=_md5s(tmp_path),
            max_file_bytes=2**20,
            **FAST,
        )
    assert "more than 1048576 bytes" in str(info.value) and "max_file_bytes" in str(info.value), str(info.value)
    assert os.listdir(tmp_path / "cache" / "fashion-mnist") == []


def test_a_killed_fetchs_temporary_file_is_swept_by_the_next_fetch(tmp_path):
    md5s = _md5s(tmp_path)
    folder = tmp_path / "cache" / "fashion-mnist"
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = folder / f".t10k-labels-idx1-ubyte.gz.{int(dead.stdout)}-0123abcd.part"
    stale.write_bytes(b"\0" * 1000)
    mine = folder / f".t10k-labels-idx1-ubyte.gz.{os.getpid()}-4567abcd.part"  # a live process's: kept
    mine.write_bytes(b"")
    fetch_dataset("fashion-mnist", tmp_path / "cache", [str(tmp_path / "generated")], md5s=md5s, **FAST)
    assert not stale.exists() and mine.exists()
