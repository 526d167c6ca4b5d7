"""Ray Train's public names that trainlib does not have, and what to use instead. Both sides.

``trainlib`` and ``trainlib.torch`` look a missing name up here (their module ``__getattr__``), so a Ray
Train program ported by changing its imports stops at the import with the way forward, not with
Python's bare "cannot import name". Details: docs/ray_train_parity.md, "Not built".
"""

from __future__ import annotations

_ASYNC_VALIDATION = (
    "trainlib has no asynchronous checkpoint validation: evaluate inside the training function "
    "and report the result with the checkpoint, e.g. trainlib.report({'val_loss': v}, checkpoint=...)."
)

NOT_BUILT: dict[str, dict[str, str]] = {
    "trainlib": {
        "UserCallback": "subclass trainlib.Callback instead: typed driver-side hooks (before_run, after_report, "
        "after_failure, after_checkpoint_deleted, after_run) in RunConfig(callbacks=[...]).",
        "LoggingConfig": "trainlib logs through the standard 'trainlib' logger: configure it with logging, e.g. "
        "logging.getLogger('trainlib').setLevel(logging.DEBUG); RunConfig(verbose=False) quiets "
        "the per-report lines.",
        "ValidationConfig": _ASYNC_VALIDATION,
        "ValidationTaskConfig": _ASYNC_VALIDATION,
        "ValidationFn": _ASYNC_VALIDATION,
        "NCCLHangError": "a hung collective fails the rank after trainlib.torch.TorchConfig(timeout_s=...), and "
        "ranks still running long after the others after FailureConfig(straggler_timeout_s=...); "
        "both raise TrainingFailedError.",
        "PreemptionError": "a node being drained shows in trainlib.get_preemption_info() on the workers, and the "
        "loss of a drained node is counted by FailureConfig(max_preemption_failures=...).",
        "SyncConfig": "Ray Train v2 dropped it too: reports are written straight to RunConfig.storage_path.",
        "BackendConfig": "trainlib's trainers take their framework's config: trainlib.torch.TorchTrainer("
        "torch_config=trainlib.torch.TorchConfig(...)).",
    },
    "trainlib.torch": {
        "TorchCheckpoint": "Ray Train deprecated it: torch.save(model.state_dict(), os.path.join(folder, "
        "'model.pt')) and report trainlib.Checkpoint.from_directory(folder).",
    },
}


def not_built(module: str, name: str) -> BaseException:
    """What ``module.name`` raises: an ImportError with the way forward for Ray Train's names, else AttributeError.

    Not an AttributeError for Ray's names: ``from trainlib import X`` would replace its message with Python's.
    """
    guidance = NOT_BUILT.get(module, {}).get(name)
    if guidance is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    ray_module = module.replace("trainlib", "ray.train", 1)
    return ImportError(
        f"{module} has no {name} (Ray Train's {ray_module}.{name}): {guidance} See docs/ray_train_parity.md.", name=name
    )
