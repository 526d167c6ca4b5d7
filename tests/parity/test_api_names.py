"""Every public name of Ray Train 2.60's modules that trainlib mirrors (``ray.train``, ``ray.train.torch``,
``ray.train.collective``, ...) imports from trainlib, or stops the import with what to use instead; every public module
of ``ray.train`` is either mirrored or listed, with the reason, as deliberately not mirrored. No Ray started, no
workers (Ray's installed sources are read, to check these lists against them)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib

import pytest

RAY_TRAIN = [
    "BackendConfig",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ControllerError",
    "DataConfig",
    "FailureConfig",
    "LoggingConfig",
    "NCCLHangError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "SyncConfig",
    "TRAIN_DATASET_KEY",
    "TrainContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
RAY_TRAIN_TORCH = [
    "TorchCheckpoint",
    "TorchConfig",
    "TorchTrainer",
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]
RAY_TRAIN_COLLECTIVE = ["barrier", "broadcast_from_rank_zero"]
RAY_TRAIN_LIGHTNING = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
RAY_TRAIN_TRANSFORMERS = ["RayTrainReportCallback", "prepare_trainer"]

# Ray Train module -> (trainlib module, Ray's public names).
MIRRORED = {
    "ray.train": ("trainlib", RAY_TRAIN),
    "ray.train.torch": ("trainlib.torch", RAY_TRAIN_TORCH),
    "ray.train.collective": ("trainlib.collective", RAY_TRAIN_COLLECTIVE),
    # Optional extras (trainlib[lightning], trainlib[transformers]): checked where the framework is installed.
    "ray.train.lightning": ("trainlib.lightning", RAY_TRAIN_LIGHTNING),
    "ray.train.huggingface.transformers": ("trainlib.huggingface.transformers", RAY_TRAIN_TRANSFORMERS),
}
FRAMEWORK = {"trainlib.lightning": "lightning", "trainlib.huggingface.transformers": "transformers"}
# Ray Train's public modules that trainlib deliberately does not mirror, and why.
NOT_MIRRORED = {
    # Other frameworks' trainers: trainlib is built for PyTorch (torch.distributed) only.
    "ray.train.tensorflow": "TensorFlow",
    "ray.train.horovod": "Horovod",
    "ray.train.xgboost": "XGBoost",
    "ray.train.lightgbm": "LightGBM",
    # PyTorch/XLA (TPUs): trainlib's backends are gloo (CPU) and NCCL (CUDA).
    "ray.train.torch.xla": "TorchXLAConfig",
}
NOT_BUILT = {
    "BackendConfig": "TorchConfig",
    "LoggingConfig": "'trainlib' logger",
    "NCCLHangError": "timeout_s",
    "PreemptionError": "get_preemption_info",
    "SyncConfig": "storage_path",
    "UserCallback": "trainlib.Callback",
    "ValidationConfig": "report the result with the checkpoint",
    "ValidationFn": "report the result",
    "ValidationTaskConfig": "report the result",
    "TorchCheckpoint": "Checkpoint.from_directory",
}


@pytest.mark.parametrize("module, name", [(module, n) for module, names in MIRRORED.values() for n in names])
def test_each_ray_train_name_imports_or_says_what_to_use_instead(module, name):
    if module in FRAMEWORK:
        pytest.importorskip(FRAMEWORK[module])
    namespace: dict = {}
    statement = f"from {module} import {name}"
    if name not in NOT_BUILT:
        exec(statement, namespace)
        assert namespace[name] is not None
        return
    with pytest.raises(ImportError) as info:
        exec(statement, namespace)
    message = str(info.value)
    ray_module = next(ray for ray, (ours, _) in MIRRORED.items() if ours == module)
    assert f"{ray_module}.{name}" in message and NOT_BUILT[name] in message, message
    assert "docs/ray_train_parity.md" in message


def test_other_missing_names_are_plain_attribute_errors():
    trainlib = importlib.import_module("trainlib")
    assert not hasattr(trainlib, "no_such_name")
    assert trainlib.TRAIN_DATASET_KEY == "train"


def _declared_names(source: str) -> list[str] | None:
    """The names a module's source puts in ``__all__`` (assigned, extended or added to, in any branch)."""
    names: set[str] = set()
    declared = False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                declared = True
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "__all__":
                names |= {c.value for a in node.args for c in ast.walk(a) if isinstance(c, ast.Constant)}
    return sorted(n for n in names if isinstance(n, str)) if declared else None


def _ray_public_modules() -> dict[str, list[str]]:
    """Ray Train's public modules (those declaring ``__all__``, Ray's mark of a public API): name -> names. Read
    from the installed sources, without importing them (some need frameworks that are not installed)."""
    spec = importlib.util.find_spec("ray.train")
    if spec is None:
        pytest.skip("ray[train] is not installed")
    root = pathlib.Path(spec.origin).parent
    found = {}
    for init in root.rglob("*.py"):
        parts = init.relative_to(root).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if any(p.startswith("_") or p in ("v2", "examples", "tests") for p in parts):
            continue
        names = _declared_names(init.read_text())
        if names is not None:
            found[".".join(("ray", "train", *parts))] = names
    return found


def test_every_public_ray_train_module_is_mirrored_or_listed_as_not():
    public = _ray_public_modules()
    unaccounted = sorted(set(public) - set(MIRRORED) - set(NOT_MIRRORED))
    assert not unaccounted, f"Ray Train modules neither mirrored nor listed in NOT_MIRRORED: {unaccounted}"
    for ray_module, (_, names) in MIRRORED.items():
        assert sorted(names) == public[ray_module], ray_module


def test_the_optional_integrations_are_imported_only_when_used():
    import subprocess
    import sys

    from conftest import REPO_ROOT

    probe = (
        "import sys, trainlib, trainlib.torch, trainlib.collective; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": REPO_ROOT}
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
