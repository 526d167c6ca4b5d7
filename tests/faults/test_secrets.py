"""Secrets: flow-run parameters never hold credentials, every URL is masked whatever its password holds, an MLflow URI
with credentials is probed as MLflow's client would use it, and an HTTP mirror behind basic auth is fetched with its
credentials (or refused with a clear error), never skipped without a word."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import threading

import pytest
from conftest import free_port

from flows.main import parse_params
from flows.params import PipelineParams, PipelineParamsError
from tasks.domain.credentials import MIRROR_CREDENTIALS_ENV_VAR
from tasks.domain.dataset_fetch import fetch_dataset
from tasks.domain.generated_dataset import write_idx_dataset
from tasks.domain.mirror_fetch import DatasetDownloadError
from tasks.domain.reachability import problems
from tasks.domain.urls import mask_url
from trainlib.masking import redact_text
from trainlib.mlflow import probe_tracking_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

USER = "bob"
PASSWORD = "pa#ss/w?rd@2"  # every character that ends a URL's user-info for a naive parser
FAST = {"backoff_s": 0.01, "timeout_s": 5.0, "attempts_per_mirror": 1}


class _BasicAuthServer:
    """A data-set mirror and an MLflow-like /health on 127.0.0.1 that answer only with the right credentials."""

    def __init__(self, root):
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        self.seen: list[str] = []
        seen = self.seen

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                seen.append(self.path)
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="mirror"')
                    self.end_headers()
                    return
                if self.path == "/health":
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"OK")
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str = "", credentials: bool = True) -> str:
        userinfo = f"{USER}:{PASSWORD}@" if credentials else ""
        return f"http://{userinfo}127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    md5s = write_idx_dataset(root / "data", n_train=20, n_test=10, seed=1)
    server = _BasicAuthServer(root)
    server.md5s = md5s
    yield server
    server.httpd.shutdown()


def test_every_url_is_masked_whatever_its_password_holds(server):
    url = server.url("/data/?token=also-secret")
    for shown in (mask_url(url), redact_text(f"Data: fashion-mnist from {url} (2 files)")):
        assert PASSWORD not in shown and "pa#ss" not in shown and "also-secret" not in shown, shown
        assert f"{USER}:[REDACTED]@127.0.0.1:{server.port}/data/" in shown, shown
    assert mask_url("s3://bucket/model@v2/x") == "s3://bucket/model@v2/x"  # an '@' in a path is no user-info


def test_the_command_moves_credentials_out_of_the_flow_run_parameters(server, monkeypatch, capsys):
    monkeypatch.delenv(MIRROR_CREDENTIALS_ENV_VAR, raising=False)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    params, _ = parse_params(["--mirrors", server.url("/data/"), "--mlflow-tracking-uri", server.url()])
    stored = params.model_dump_json()
    assert PASSWORD not in stored and USER not in stored, stored  # what Prefect would keep with the flow run
    assert params.mirrors == [server.url("/data/", credentials=False)]
    assert params.mlflow_tracking_uri == server.url(credentials=False)
    import os

    assert os.environ["MLFLOW_TRACKING_USERNAME"] == USER and os.environ["MLFLOW_TRACKING_PASSWORD"] == PASSWORD
    assert json.loads(os.environ[MIRROR_CREDENTIALS_ENV_VAR])[server.url("/data/", credentials=False)] == {
        "username": USER,
        "password": PASSWORD,
    }
    told = capsys.readouterr().out
    assert "MLFLOW_TRACKING_USERNAME" in told and MIRROR_CREDENTIALS_ENV_VAR in told and PASSWORD not in told
    # Parameters given another way (a deployment run) are refused, the value masked in the message.
    with pytest.raises(PipelineParamsError) as info:
        PipelineParams.parse({"mlflow_tracking_uri": server.url()})
    assert "holds credentials" in str(info.value) and PASSWORD not in str(info.value), str(info.value)


def test_an_mlflow_uri_with_credentials_is_probed_as_mlflow_would_use_it(server):
    probe_tracking_server(server.url(), timeout_s=5)  # no InvalidURL, no gaierror: basic auth to the server
    assert server.seen[-1] == "/health"
    assert problems(None, server.url(), None, "node 10.0.0.2") != []  # loopback, named without choking
    assert all(PASSWORD not in str(p) for p in problems(None, server.url(), None, "node 10.0.0.2"))


def test_an_http_mirror_behind_basic_auth_is_fetched_with_its_credentials(server, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(MIRROR_CREDENTIALS_ENV_VAR, raising=False)
    in_url = fetch_dataset("fashion-mnist", tmp_path / "a", [server.url("/data/")], md5s=server.md5s, **FAST)
    assert len(in_url.downloaded) == 4
    stripped = server.url("/data/", credentials=False)
    monkeypatch.setenv(MIRROR_CREDENTIALS_ENV_VAR, json.dumps({stripped: {"username": USER, "password": PASSWORD}}))
    from_env = fetch_dataset("fashion-mnist", tmp_path / "b", [stripped], md5s=server.md5s, **FAST)
    assert len(from_env.downloaded) == 4
    # Without credentials: a clear error naming what to do, and a warning when the next mirror is tried.
    monkeypatch.delenv(MIRROR_CREDENTIALS_ENV_VAR)
    with caplog.at_level(logging.WARNING, logger="trainlib"), pytest.raises(DatasetDownloadError) as info:
        fetch_dataset("fashion-mnist", tmp_path / "c", [stripped], md5s=server.md5s, **FAST)
    assert "401" in str(info.value) and "refused access" in str(info.value) and "user:password@" in str(info.value)
    assert any("trying the next mirror" in r.getMessage() for r in caplog.records)
