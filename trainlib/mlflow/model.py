"""``log_model``: a checkpoint's weights into a torch model, logged (and registered) in MLflow. Driver only."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from mlflow.tracking import MlflowClient

from trainlib._internal.storage.run_record import RUN_STATE_FILE, RunRecord
from trainlib._internal.util.filesystem import is_local_filesystem
from trainlib.checkpoint import Checkpoint
from trainlib.mlflow._store import STATE_KEY, default_tracking_uri, using_tracking_uri


def log_model(
    checkpoint: Checkpoint,
    model: Any,
    *,
    state_dict_file: str = "model.pt",
    state_dict_key: str | None = None,
    input_example: Any = None,
    registered_model_name: str | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    artifact_path: str = "model",
) -> Any:
    """Load a checkpoint's weights into ``model`` and log it to MLflow (optionally registering it).

    The state dict is read from ``state_dict_file`` in the checkpoint (or from
    ``obj[state_dict_key]`` when the file holds a dict of several things); a DDP
    ``module.`` prefix is stripped, so pass the plain, unwrapped model. With an
    ``input_example`` the model's signature is inferred from it and the model's
    output on it.

    Args:
        checkpoint: a trainlib checkpoint, e.g. ``result.checkpoint``.
        model: a ``torch.nn.Module`` of the trained architecture.
        state_dict_file: the file in the checkpoint holding the state dict.
        state_dict_key: the key of the state dict when the file holds a dict of several objects.
        input_example: a batch (tensor or numpy array) for the signature and example.
        registered_model_name: also register the model under this name (a new version).
        run_id: the MLflow run to log into. Default: the run that ``MLflowLogger``
            recorded for the checkpoint's trainlib run, else the active MLflow run.
        tracking_uri: default: the URI recorded with that run, else ``MLFLOW_TRACKING_URI``,
            else the embedded ``sqlite:///<cwd>/mlflow.db``.
        artifact_path: the logged model's name.

    Returns:
        ``mlflow.models.model.ModelInfo``; ``info.model_uri`` loads it back and,
        when registered, ``info.registered_model_version`` is the new version.

    Raises:
        FileNotFoundError: the checkpoint has no ``state_dict_file``.
        ValueError: no MLflow run to log into, or the weights do not fit ``model``.

    Example:
        >>> info = log_model(result.checkpoint, Net(), input_example=images[:8],
        ...                  registered_model_name="fashion-mnist")
        >>> mlflow.pytorch.load_model(info.model_uri)
    """
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            f"log_model(checkpoint=...) takes a trainlib.Checkpoint (e.g. result.checkpoint), "
            f"got {type(checkpoint).__name__}."
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"log_model(model=...) takes a torch.nn.Module, got {type(model).__name__}.")
    recorded = _recorded_run(checkpoint)
    if run_id is None and recorded.get("run_id"):
        run_id = recorded["run_id"]
        if tracking_uri is None and "[REDACTED]" not in recorded.get("tracking_uri", "[REDACTED]"):
            tracking_uri = recorded["tracking_uri"]
    tracking_uri = tracking_uri or default_tracking_uri()

    state = _load_state_dict(checkpoint, state_dict_file, state_dict_key)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"log_model: the weights in {checkpoint.uri}/{state_dict_file} do not fit {type(model).__name__}: "
            f"{str(exc).splitlines()[0]} ... Pass a model of the architecture that was trained."
        ) from exc
    model.eval()

    signature, example = None, None
    if input_example is not None:
        example_tensor = input_example if isinstance(input_example, torch.Tensor) else torch.as_tensor(input_example)
        with torch.no_grad():
            output = model(example_tensor)
        example = example_tensor.detach().cpu().numpy()
        signature = infer_signature(example, output.detach().cpu().numpy())

    with using_tracking_uri(tracking_uri):
        active = mlflow.active_run()
        if run_id is None and active is None:
            raise ValueError(
                "log_model: no MLflow run to log into: the checkpoint's trainlib run has no MLflowLogger "
                "record and no MLflow run is active. Pass run_id=... (e.g. logger.run_id), or call it "
                "inside `with mlflow.start_run():`."
            )
        if run_id is None or (active is not None and active.info.run_id == run_id):
            return mlflow.pytorch.log_model(
                model,
                name=artifact_path,
                signature=signature,
                input_example=example,
                registered_model_name=registered_model_name,
            )
        client = MlflowClient(tracking_uri=tracking_uri)
        before = client.get_run(run_id).info
        with mlflow.start_run(run_id=run_id, nested=active is not None):
            info = mlflow.pytorch.log_model(
                model,
                name=artifact_path,
                signature=signature,
                input_example=example,
                registered_model_name=registered_model_name,
            )
        if before.status != "RUNNING":
            # Keep the training run's own end state and end time (FAILED stays FAILED).
            client.set_terminated(run_id, before.status, end_time=before.end_time)
        return info


def _recorded_run(checkpoint: Checkpoint) -> dict[str, Any]:
    """What MLflowLogger recorded in the checkpoint's trainlib run folder (``{}`` when nothing)."""
    run_dir = posixpath.dirname(checkpoint.path.rstrip("/"))
    state_file = posixpath.join(run_dir, RUN_STATE_FILE)
    if not is_local_filesystem(checkpoint._fs):
        state_file = checkpoint._fs._strip_protocol(state_file)
    try:
        record = RunRecord.from_json(json.loads(checkpoint._fs.cat_file(state_file)))
    except (FileNotFoundError, ValueError, TypeError, AttributeError, OSError):
        return {}
    return record.callbacks.get(STATE_KEY) or {}


def _load_state_dict(checkpoint: Checkpoint, state_dict_file: str, state_dict_key: str | None) -> dict[str, Any]:
    import torch

    path = posixpath.join(checkpoint.path.rstrip("/"), state_dict_file)
    if not checkpoint._fs.exists(path):
        try:
            present = sorted(posixpath.basename(p) for p in checkpoint._fs.ls(checkpoint.path, detail=False))
        except OSError:
            present = []
        raise FileNotFoundError(
            f"log_model: checkpoint {checkpoint.uri} has no {state_dict_file!r} (it holds {present}). "
            "Pass state_dict_file= the file your training function saved with torch.save(model.state_dict(), ...)."
        )
    with checkpoint._fs.open(path, "rb") as f:
        obj = torch.load(f, map_location="cpu", weights_only=True)
    if state_dict_key is not None:
        if not isinstance(obj, dict) or state_dict_key not in obj:
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(
                f"log_model(state_dict_key={state_dict_key!r}): {state_dict_file} holds {keys}; pass one of those keys."
            )
        obj = obj[state_dict_key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        keys = sorted(obj)[:10] if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(
            f"log_model: {state_dict_file} in {checkpoint.uri} is not a state dict of tensors (it holds {keys}). "
            "If it bundles several objects, pass state_dict_key='model' (the key of the model's state dict)."
        )
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}  # saved from the DDP wrapper
    return obj
