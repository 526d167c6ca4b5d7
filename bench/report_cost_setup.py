"""The report-cost benchmark's setup (bench_report.py): an S3 endpoint (moto), the local-copy floor, Ray Train.

Runs in the benchmark's parent process, before the jobs; the jobs get the S3 endpoint through their environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import tempfile
import time
from typing import Any

BUCKET = "bench-report-cost"


def local_copy_seconds(repeats: int = 5) -> tuple[float, int]:
    """The floor: seconds (median) to copy a ResNet18 checkpoint folder once on the local disk, and its bytes."""
    import torch
    import torchvision

    src = tempfile.mkdtemp(prefix="bench_copy_src_")
    torch.save(torchvision.models.resnet18().state_dict(), os.path.join(src, "model.pt"))
    times = []
    for _ in range(repeats):
        dst = tempfile.mkdtemp(prefix="bench_copy_dst_")
        t0 = time.perf_counter()
        shutil.copytree(src, dst, dirs_exist_ok=True)
        times.append(time.perf_counter() - t0)
        shutil.rmtree(dst)
    size = os.path.getsize(os.path.join(src, "model.pt"))
    shutil.rmtree(src)
    return statistics.median(times), size


def start_s3() -> tuple[Any, dict[str, str]]:
    """moto's S3 server on 127.0.0.1 with the benchmark's bucket; its fake credentials, also set in this process."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per S3 request otherwise
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench-fake-key",
        "AWS_SECRET_ACCESS_KEY": "bench-fake-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(BUCKET)
    return server, env


def ray_train_available() -> bool:
    try:
        import ray.train.torch  # noqa: F401

        return True
    except ImportError:
        return False
