"""What a pipeline process imports before a step needs it: mlflow only when a step uses it (~1-1.5 s of CPU each)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT


def _modules_after(code: str) -> set[str]:
    """The top-level modules in ``sys.modules`` of a fresh process after ``code`` ran in it."""
    probe = f"import sys\n{code}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(done.stdout.split())


def test_the_flow_module_a_logger_and_the_source_tags_do_not_import_mlflow_and_a_run_start_does():
    # Every Ray task process of the pipeline imports the flow's module (Prefect sends each task the flow run's
    # context) before its first task, the download; the flow process builds the run's tags before Ray starts; the
    # train task builds its MLflowLogger before fit() asks for the actors. The flow's module imports neither torch
    # nor Ray either: a run that skips an unchanged week ends before the steps (flows.pipeline_steps) are imported.
    modules = _modules_after(
        "import flows.pipeline\n"
        "from tasks.domain.lineage import source_tags\n"
        "from trainlib.mlflow import MLflowLogger, TrackingError, default_tracking_uri, using_tracking_uri\n"
        "MLflowLogger(experiment_name='e', log_checkpoints='best')\n"
        "tags = source_tags('flows.pipeline:training-pipeline')\n"
        "assert tags['mlflow.source.name'] == 'flows.pipeline:training-pipeline', tags"
    )
    assert {"prefect", "trainlib", "tasks"} <= modules
    assert not {"mlflow", "torch", "torchvision", "ray", "prefect_ray"} & modules, modules

    # The names whose modules need mlflow import it when first asked for.
    assert "mlflow" in _modules_after("from trainlib.mlflow import log_model, SpoolReplay")


def test_ray_works_when_prefect_imported_prefect_ray_first():
    # A worker's flow-run process imports prefect-ray at start-up (a Prefect collection), which imports Ray lazily;
    # the task runner's module loads it whole before the lean start imports one of Ray's submodules.
    modules = _modules_after(
        "import prefect_ray\n"
        "import flows.task_runner\n"
        "from ray._private import utils\n"
        "import ray\n"
        "assert not ray.is_initialized()"
    )
    assert "ray" in modules


_FIT_WITH_A_LOGGER = """
import sys
import trainlib
from trainlib.torch import TorchTrainer
from trainlib.mlflow import MLflowLogger

def train_func(config):
    trainlib.report({"loss": 0.5, "mlflow_imported": float("mlflow" in sys.modules)})

folder = sys.argv[1]
logger = MLflowLogger(tracking_uri=f"sqlite:///{folder}/mlflow.db", experiment_name="imports")
before = "mlflow" in sys.modules
result = TorchTrainer(train_func, scaling_config=trainlib.ScalingConfig(num_workers=0),
                      run_config=trainlib.RunConfig(name="imports", storage_path=folder, callbacks=[logger])).fit()
from mlflow import MlflowClient
run = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db").get_run(logger.run_id)
print(before, result.metrics["mlflow_imported"], run.data.metrics["loss"], run.info.status)
"""


def test_a_logger_imports_mlflow_as_its_run_starts_and_logs_the_run(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _FIT_WITH_A_LOGGER, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Not imported when the logger was built; imported by the time the training function ran (before_run comes
    # first); the run was logged and ended as before.
    assert done.stdout.split()[-4:] == ["False", "1.0", "0.5", "FINISHED"], done.stdout[-2000:]


def test_the_source_tags_are_mlflows_reserved_names():
    from mlflow.utils import mlflow_tags

    from tasks.domain import lineage

    assert (lineage.SOURCE_NAME_TAG, lineage.SOURCE_TYPE_TAG, lineage.USER_TAG, lineage.GIT_COMMIT_TAG) == (
        mlflow_tags.MLFLOW_SOURCE_NAME,
        mlflow_tags.MLFLOW_SOURCE_TYPE,
        mlflow_tags.MLFLOW_USER,
        mlflow_tags.MLFLOW_GIT_COMMIT,
    )
