"""Shared pieces of the fault tests: a moto S3 server, a driver script run as a separate process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

from conftest import REPO_ROOT, free_port

PYTHON = sys.executable


class MotoS3:
    """moto's S3 server over HTTP on 127.0.0.1 with fake credentials; ``env`` points clients at it."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.bucket = "faults-" + uuid.uuid4().hex[:8]
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "AKIAFAULTSFAKE",
            "AWS_SECRET_ACCESS_KEY": "faults-secret-" + uuid.uuid4().hex,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def __enter__(self) -> MotoS3:
        self.server.start()
        self.fs().mkdir(self.bucket)
        return self

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(
            endpoint_url=self.endpoint,
            key=self.env["AWS_ACCESS_KEY_ID"],
            secret=self.env["AWS_SECRET_ACCESS_KEY"],
            skip_instance_cache=True,
        )

    def options(self) -> dict:
        return {
            "endpoint_url": self.endpoint,
            "key": self.env["AWS_ACCESS_KEY_ID"],
            "secret": self.env["AWS_SECRET_ACCESS_KEY"],
        }

    def __exit__(self, *exc) -> None:
        self.server.stop()


def start_driver(script: str, env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Run ``script`` (Python source) as a separate driver process with this checkout on its path."""
    full_env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(
            [REPO_ROOT, os.path.join(REPO_ROOT, "tests"), os.path.join(REPO_ROOT, "tests", "faults")]
        ),
    }
    return subprocess.Popen(
        [PYTHON, "-c", textwrap.dedent(script)],
        env=full_env,
        cwd=cwd or REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
