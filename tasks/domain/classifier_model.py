"""The registered image classifier: raw 28x28 images in, label, class name and probabilities out.

Runs wherever a registered version is loaded: a user's process
(``mlflow.pyfunc.load_model("models:/<name>@champion")``), ``mlflow models
serve``, the batch-scoring workers, and the pipeline's evaluate step. MLflow
copies this file into every registered version (models-from-code), so it is
self-contained on purpose: it imports only numpy, pandas, torch, mlflow and its
network (``classifier_network.py``, torch only, shipped beside it in the version's
``code/`` folder; not even torchvision), never ``tasks``, ``flows`` or ``trainlib``.
What the model needs besides its weights (normalisation, class names, the data
set's identity) comes from the version's ``model_config``, written by
``tasks.domain.model_package``.

Input (any batch size): uint8 images, or float images in 0..255, shaped
``[N, 28, 28]``, ``[N, 784]`` or ``[N, 1, 28, 28]`` (a numpy array, a torch
tensor, nested lists, or a DataFrame with 784 pixel columns). Output: a
DataFrame with one row per image: ``label`` (int), ``class``, ``probability``
(of that label) and ``probabilities`` (all ten, in label order).

Example::

    model = mlflow.pyfunc.load_model("models:/fashion-mnist-resnet18@champion")
    model.predict(images_uint8)                  # DataFrame: label, class, probability, probabilities
    net = model.unwrap_python_model().network    # the torch.nn.Module itself
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

if __package__:  # imported from this repository, as tasks.domain.classifier_model
    from .classifier_network import ARCHITECTURE, EXPECTED_INPUT, forward_in_batches, network_with_weights
else:  # executed by MLflow: loading a version, whose code/ folder (code_paths) MLflow puts on sys.path ...
    try:
        from classifier_network import ARCHITECTURE, EXPECTED_INPUT, forward_in_batches, network_with_weights
    except ModuleNotFoundError as exc:  # ... or saving one, from this repository
        if exc.name != "classifier_network":
            raise
        from tasks.domain.classifier_network import (
            ARCHITECTURE,
            EXPECTED_INPUT,
            forward_in_batches,
            network_with_weights,
        )

IMAGE_SIDE = 28
PIXELS = IMAGE_SIDE * IMAGE_SIDE
OUTPUT_COLUMNS = ("label", "class", "probability", "probabilities")
DEFAULT_BATCH_SIZE = 256  # images per forward pass; bounds memory for large requests


class ImageInputError(MlflowException, ValueError):
    """The images handed to ``predict`` have the wrong shape, dtype or values.

    An ``MlflowException`` with INVALID_PARAMETER_VALUE, so ``mlflow models
    serve`` answers HTTP 400 with this message; also a ``ValueError``.
    """

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


def normalise(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """Pixel values 0..255 ``[N, 28, 28]`` -> the network's input ``[N, 1, 28, 28]`` (ToTensor + Normalize)."""
    return ((images.to(torch.float32) / 255.0 - mean) / std).unsqueeze(1)


def as_image_batch(data: Any) -> torch.Tensor:
    """Any accepted input form -> a float32 tensor ``[N, 28, 28]`` of pixel values 0..255.

    Raises:
        ImageInputError: wrong shape, a non-numeric dtype, values outside 0..255, or no image.
    """
    array = _to_numpy(data)
    if array.dtype == object:
        try:
            array = np.asarray(array.tolist(), dtype=np.float64)
        except (TypeError, ValueError):
            raise ImageInputError(f"The input holds non-numeric or ragged values; expected {EXPECTED_INPUT}.") from None
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ImageInputError(f"Input dtype {array.dtype} is not an image dtype; expected {EXPECTED_INPUT}.")
    shape = tuple(array.shape)
    if len(shape) == 2 and shape[1] == PIXELS:
        array = array.reshape(shape[0], IMAGE_SIDE, IMAGE_SIDE)
    elif len(shape) == 4 and shape[1:] == (1, IMAGE_SIDE, IMAGE_SIDE):
        array = array.reshape(shape[0], IMAGE_SIDE, IMAGE_SIDE)
    elif not (len(shape) == 3 and shape[1:] == (IMAGE_SIDE, IMAGE_SIDE)):
        hint = " (one image? add a batch dimension: images[None])" if shape in ((28, 28), (784,), (1, 28, 28)) else ""
        raise ImageInputError(f"Input shape {list(shape)} is not accepted{hint}; expected {EXPECTED_INPUT}.")
    if array.shape[0] == 0:
        raise ImageInputError(f"The input holds no image; expected {EXPECTED_INPUT} with N >= 1.")
    if array.dtype != np.uint8:
        low, high = float(array.min()), float(array.max())
        if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high > 255:
            raise ImageInputError(
                f"Pixel values span {low:g}..{high:g}; expected values 0..255. Pass {EXPECTED_INPUT}."
            )
        if 0 < high <= 1:  # an image already scaled to 0..1 would be read as nearly black: refuse, not guess
            raise ImageInputError(
                f"Pixel values span {low:g}..{high:g}: they look scaled to 0..1; multiply by 255. "
                f"Pass {EXPECTED_INPUT}."
            )
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _to_numpy(data: Any) -> np.ndarray:
    if isinstance(data, torch.Tensor):
        return data.detach().cpu().numpy()
    if isinstance(data, pd.DataFrame):
        if data.shape[1] == 1:  # one column holding an image (nested list / array) per row
            return np.asarray(data.iloc[:, 0].tolist())
        return data.to_numpy()
    if isinstance(data, dict):
        if len(data) != 1:
            raise ImageInputError(
                f"A dict input must hold one array of images, got keys {sorted(data)}; expected {EXPECTED_INPUT}."
            )
        return _to_numpy(next(iter(data.values())))
    try:
        return np.asarray(data)
    except (TypeError, ValueError):
        raise ImageInputError(f"Cannot read {type(data).__name__} as images; expected {EXPECTED_INPUT}.") from None


def predict_probabilities(
    network: torch.nn.Module, images: torch.Tensor, mean: float, std: float, batch_size: int = DEFAULT_BATCH_SIZE
) -> torch.Tensor:
    """Class probabilities ``[N, classes]`` of pixel-value images ``[N, 28, 28]`` (eval mode, no grad)."""
    logits = forward_in_batches(network, images, lambda batch: normalise(batch, mean, std), batch_size)
    return torch.softmax(logits.float(), dim=1)


def predictions_frame(probabilities: torch.Tensor, class_names: Sequence[str]) -> pd.DataFrame:
    """The output DataFrame: label, class, probability (of the label), probabilities (all classes)."""
    best, labels = probabilities.max(dim=1)
    names = np.asarray(class_names, dtype=object)
    probs = probabilities.double().numpy()
    return pd.DataFrame(
        {
            "label": labels.numpy().astype(np.int64),
            "class": names[labels.numpy()],
            "probability": best.double().numpy(),
            "probabilities": list(probs),
        },
        columns=list(OUTPUT_COLUMNS),
    )


class ImageClassifier(mlflow.pyfunc.PythonModel):
    """The pyfunc model of a registered version (loaded by MLflow from this file).

    ``model_config`` keys: ``class_names`` (list), ``mean`` and ``std`` (the training
    data's pixel statistics on the 0..1 scale), ``architecture``. Artifact ``weights``:
    the network's state dict (``torch.save``; loaded with ``weights_only=True``).
    """

    # No type hints on predict: hints would make MLflow derive an input schema, which this model must not have
    # (it accepts several shapes and dtypes and checks them itself). This flag, the one MLflow sets on its own
    # built-in models, skips that check; without it, defining the class printed a yellow "Add type hints to the
    # `predict` method" UserWarning wherever this file runs: every pipeline step's worker, each registration,
    # load and `mlflow models serve`.
    _skip_type_hint_validation = True

    def __init__(self) -> None:
        self.network: torch.nn.Module | None = None
        self.class_names: tuple[str, ...] = ()
        self.mean = 0.0
        self.std = 1.0

    def load_context(self, context: Any) -> None:
        config = dict(context.model_config or {})
        missing = [key for key in ("class_names", "mean", "std") if key not in config]
        if missing or "weights" not in context.artifacts:
            raise MlflowException(
                f"This model version is incomplete: model_config lacks {missing} or the "
                "'weights' artifact is missing. Re-register it with tasks.domain.model_package."
            )
        self.class_names = tuple(config["class_names"])
        self.mean, self.std = float(config["mean"]), float(config["std"])
        state = torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True)
        self.network = network_with_weights(state, len(self.class_names), config.get("architecture", ARCHITECTURE))

    def predict(self, context, model_input, params=None):
        if self.network is None:
            raise MlflowException("The model has no network loaded: load it with mlflow.pyfunc.load_model(uri).")
        images = as_image_batch(model_input)
        batch_size = int((params or {}).get("batch_size", DEFAULT_BATCH_SIZE))
        return predictions_frame(
            predict_probabilities(self.network, images, self.mean, self.std, batch_size), self.class_names
        )


# Models-from-code: MLflow executes this file when loading a version and takes this object.
mlflow.models.set_model(ImageClassifier())
