"""The registered image classifier: images as clients have them in, label, class name and probabilities out.

Runs wherever a registered version is loaded: a user's process
(``mlflow.pyfunc.load_model("models:/<name>@champion")``), ``mlflow models
serve``, the batch-scoring workers, and the pipeline's evaluate step. MLflow
copies this file into every registered version (models-from-code), so it is
self-contained on purpose: it imports only numpy, pandas, torch, mlflow and the
files shipped beside it in the version's ``code/`` folder (``code_paths``):
its network (``classifier_network.py``, torch only; not even torchvision), the
image shape (``image_spec.py``), the input forms (``image_input.py``) and the
preprocessing shared with training (``image_preprocessing.py``, PIL for
decoding); never ``tasks``, ``flows`` or ``trainlib``. What the model needs
besides its weights (the image spec: channels, size and class names;
normalisation; architecture) comes from the version's ``model_config``, written
by ``tasks.domain.model_package``; a version without channels and size in it is
a gray 28x28 one.

Input (any batch size, any image size; see ``image_input``): PNG or JPEG bytes
or base64 strings of them in a column ``image``, or pixel arrays 0..255 shaped
``[N, H, W]``, ``[N, H, W, C]`` or ``[N, C, H, W]``; every image is converted to
the model's channels and resized to its size, as training does. Output: a
DataFrame with one row per image: ``label`` (int), ``class``, ``probability``
(of that label) and ``probabilities`` (all classes, in label order).

Example::

    model = mlflow.pyfunc.load_model("models:/fashion-mnist-resnet18@champion")
    model.predict(images_uint8)                            # DataFrame: label, class, probability, probabilities
    model.predict(pd.DataFrame({"image": [png_bytes]}))    # encoded images
    net = model.unwrap_python_model().network              # the torch.nn.Module itself
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
    from .classifier_network import ARCHITECTURE, forward_in_batches, network_with_weights
    from .image_input import InputFormError, image_batch
    from .image_spec import ImageSpec
else:  # executed by MLflow: loading a version, whose code/ folder (code_paths) MLflow puts on sys.path ...
    try:
        from classifier_network import ARCHITECTURE, forward_in_batches, network_with_weights
        from image_input import InputFormError, image_batch
        from image_spec import ImageSpec
    except ModuleNotFoundError as exc:  # ... or saving one, from this repository
        if exc.name not in ("classifier_network", "image_input", "image_spec", "image_preprocessing"):
            raise
        from tasks.domain.classifier_network import ARCHITECTURE, forward_in_batches, network_with_weights
        from tasks.domain.image_input import InputFormError, image_batch
        from tasks.domain.image_spec import ImageSpec

# What a version whose model_config names no image shape was trained on (every version before ImageSpec).
LEGACY_SHAPE = {"channels": 1, "height": 28, "width": 28}
OUTPUT_COLUMNS = ("label", "class", "probability", "probabilities")
DEFAULT_BATCH_SIZE = 256  # images per forward pass; bounds memory for large requests


class ImageInputError(MlflowException, ValueError):
    """The images handed to ``predict`` are not an accepted form (shape, dtype, values, bytes, column).

    An ``MlflowException`` with INVALID_PARAMETER_VALUE, so ``mlflow models
    serve`` answers HTTP 400 with this message; also a ``ValueError``. ``row``: the
    position of the image at fault, when one is.
    """

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)
        self.row = row


def normalise(images: torch.Tensor, mean: float | Sequence[float], std: float | Sequence[float]) -> torch.Tensor:
    """Pixel values 0..255 ``[N, C, H, W]`` (or gray ``[N, H, W]``) -> the network's input ``[N, C, H, W]``
    (ToTensor + Normalize; ``mean`` and ``std`` on the 0..1 scale, one value or one per channel)."""
    if images.ndim == 3:
        images = images.unsqueeze(1)
    if not isinstance(mean, (int, float)) or not isinstance(std, (int, float)):
        mean = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        std = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
    return (images.to(torch.float32) / 255.0 - mean) / std


def as_image_batch(data: Any, spec: ImageSpec | None = None) -> torch.Tensor:
    """Any accepted input form -> a float32 tensor ``[N, C, H, W]`` of pixel values 0..255 of ``spec``'s channels
    and size (default: gray 28x28), converted and resized as training does.

    Raises:
        ImageInputError: not an accepted form; the message names the row at fault and what is accepted.
    """
    shape = (spec.channels, spec.height, spec.width) if spec else tuple(LEGACY_SHAPE.values())
    try:
        return image_batch(data, *shape)
    except InputFormError as exc:
        raise ImageInputError(str(exc), exc.row) from None


def predict_probabilities(
    network: torch.nn.Module, images: torch.Tensor, mean: float, std: float, batch_size: int = DEFAULT_BATCH_SIZE
) -> torch.Tensor:
    """Class probabilities ``[N, classes]`` of pixel-value images ``[N, C, H, W]`` or ``[N, H, W]`` (eval mode,
    no grad)."""
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

    ``model_config`` keys: ``class_names`` (list), ``channels``, ``height``, ``width`` (the
    ``ImageSpec``; a version without them is gray 28x28), ``mean`` and ``std`` (the training data's
    pixel statistics on the 0..1 scale: one value, or one per channel), ``architecture``. Artifact
    ``weights``: the network's state dict (``torch.save``; loaded with ``weights_only=True``).
    """

    # No type hints on predict: hints would make MLflow derive an input schema, which this model must not have
    # (it accepts several shapes and dtypes and checks them itself). This flag, the one MLflow sets on its own
    # built-in models, skips that check; without it, defining the class printed a yellow "Add type hints to the
    # `predict` method" UserWarning wherever this file runs: every pipeline step's worker, each registration,
    # load and `mlflow models serve`.
    _skip_type_hint_validation = True

    def __init__(self) -> None:
        self.network: torch.nn.Module | None = None
        self.spec: ImageSpec | None = None
        self.mean: float | list[float] = 0.0
        self.std: float | list[float] = 1.0

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.spec.class_names if self.spec else ()

    def load_context(self, context: Any) -> None:
        config = dict(context.model_config or {})
        missing = [key for key in ("class_names", "mean", "std") if key not in config]
        if missing or "weights" not in context.artifacts:
            raise MlflowException(
                f"This model version is incomplete: model_config lacks {missing} or the "
                "'weights' artifact is missing. Re-register it with tasks.domain.model_package."
            )
        self.spec = ImageSpec.from_record({**LEGACY_SHAPE, **config})
        self.mean, self.std = config["mean"], config["std"]
        state = torch.load(context.artifacts["weights"], map_location="cpu", weights_only=True)
        self.network = network_with_weights(state, self.spec.num_classes, config.get("architecture", ARCHITECTURE))

    def predict(self, context, model_input, params=None):
        if self.network is None:
            raise MlflowException("The model has no network loaded: load it with mlflow.pyfunc.load_model(uri).")
        images = as_image_batch(model_input, self.spec)
        batch_size = int((params or {}).get("batch_size", DEFAULT_BATCH_SIZE))
        return predictions_frame(
            predict_probabilities(self.network, images, self.mean, self.std, batch_size), self.class_names
        )


# Models-from-code: MLflow executes this file when loading a version and takes this object.
mlflow.models.set_model(ImageClassifier())
