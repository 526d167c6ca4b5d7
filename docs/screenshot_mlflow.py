"""Take docs/mlflow_run.png: a trainlib run's page in the MLflow UI, learning curves visible.

    .venv/bin/python docs/screenshot_mlflow.py            # writes docs/mlflow_run.png

It starts a real `mlflow server` (SQLite store, local artifacts) in a temporary
folder, trains a small classifier on synthetic data with 2 DDP workers and
``MLflowLogger``, opens the run's "Model metrics" tab in headless Chromium
(/usr/bin/chromium, driven by Playwright) and saves the screenshot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def train_func(config):
    """A tiny MLP on a fixed synthetic 3-class problem; reports loss and accuracy each epoch."""
    import torch

    import trainlib
    from trainlib.torch import prepare_model

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    shard = slice(trainlib.get_context().get_world_rank(), None, trainlib.get_context().get_world_size())
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    for epoch in range(config["epochs"]):
        for batch in torch.split(torch.arange(512)[shard], config["batch_size"]):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            logits = model(x)
            trainlib.report(
                {
                    "loss": torch.nn.functional.cross_entropy(logits, y).item(),
                    "accuracy": (logits.argmax(1) == y).float().mean().item(),
                    "epoch": epoch,
                }
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    mlflow_bin = os.path.join(os.path.dirname(sys.executable), "mlflow")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [
            mlflow_bin,
            "server",
            "--backend-store-uri",
            f"sqlite:///{root}/mlflow.db",
            "--artifacts-destination",
            f"{root}/mlartifacts",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return proc, uri
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("mlflow server did not start within 90 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(HERE, "mlflow_run.png"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright
    from ray import cloudpickle  # trainlib's pickler

    import trainlib
    from trainlib.mlflow import MLflowLogger
    from trainlib.torch import TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    root = tempfile.mkdtemp(prefix="trainlib_mlflow_docs_")
    proc, uri = start_server(root)
    try:
        logger = MLflowLogger(tracking_uri=uri, experiment_name="synthetic-mlp-demo", log_checkpoints="uri")
        TorchTrainer(
            train_func,
            train_loop_config={"lr": 0.05, "epochs": 25, "batch_size": 32},
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(name="mlp-demo", storage_path=os.path.join(root, "runs"), callbacks=[logger]),
        ).fit()
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=args.chromium,
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            run_page = f"{uri}/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"
            page.goto(run_page)
            page.get_by_text("mlp-demo").first.wait_for(timeout=90_000)
            # Show MLflow's classic-ML ("Model training") view and hide the assistant side panel.
            if page.get_by_text("Model training").count():
                page.get_by_text("Model training").first.click()
            close = page.get_by_role("button", name="Close")
            if close.count():
                close.first.click()
            page.goto(f"{run_page}/model-metrics")
            chart = page.locator('[data-testid="experiment-view-compare-runs-card"]').filter(has_text="loss").first
            chart.locator(".js-plotly-plot .scatterlayer .trace path.js-line").first.wait_for(timeout=90_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=args.output)
            browser.close()
        print(f"wrote {args.output} (run {logger.run_id})")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
