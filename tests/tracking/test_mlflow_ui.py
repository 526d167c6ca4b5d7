"""The MLflow UI of a real `mlflow server` shows a trainlib run and its learning curve (headless Chromium)."""

from __future__ import annotations

import pytest
from mlflow_helpers import have_chromium, mlflow_server, train_linear  # noqa: F401 - mlflow_server is a fixture

import trainlib
from trainlib.mlflow import MLflowLogger
from trainlib.torch import TorchTrainer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        have_chromium() is None,
        reason="Chromium is not installed: apt-get install -y chromium "
        "(the UI test drives /usr/bin/chromium with Playwright)",
    ),
]

UI_TIMEOUT_MS = 90_000


def test_run_page_and_metric_chart_render(ray_session, mlflow_server, storage_path):
    from mlflow import MlflowClient
    from playwright.sync_api import sync_playwright

    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="ui", log_checkpoints="best")
    # "best" by the lowest step_seen is the first checkpoint, not the last: the choice is visible.
    best = trainlib.CheckpointConfig(checkpoint_score_attribute="step_seen", checkpoint_score_order="min")
    result = TorchTrainer(
        train_linear,
        train_loop_config={"steps": 6, "lr": 0.05},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(
            name="ui-run", storage_path=storage_path, callbacks=[logger], checkpoint_config=best
        ),
    ).fit()
    assert result.error is None
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    assert [a.path for a in client.list_artifacts(logger.run_id, "checkpoints")] == ["checkpoints/checkpoint_000001"]
    assert client.get_run(logger.run_id).data.tags["trainlib.best_checkpoint"].endswith("checkpoint_000001")
    run_url = f"{mlflow_server.uri}/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=have_chromium(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(run_url)
            # The run page: its name, its status and a logged param.
            page.get_by_text("ui-run").first.wait_for(timeout=UI_TIMEOUT_MS)
            page.get_by_text("Finished").first.wait_for(timeout=UI_TIMEOUT_MS)
            page.get_by_text("scaling_config.num_workers").first.wait_for(timeout=UI_TIMEOUT_MS)

            # The model metrics tab draws the loss curve: a chart card titled "loss" with a plotted line.
            page.goto(f"{run_url}/model-metrics")
            card = page.locator('[data-testid="experiment-view-compare-runs-card"]').filter(has_text="loss").first
            card.wait_for(timeout=UI_TIMEOUT_MS)
            line = card.locator(".js-plotly-plot .scatterlayer .trace path.js-line").first
            line.wait_for(timeout=UI_TIMEOUT_MS)
            assert len(line.get_attribute("d") or "") > 10  # a drawn polyline, not an empty trace
            assert "Step" in card.inner_text()
        finally:
            browser.close()
