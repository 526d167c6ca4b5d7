"""Packages a trained network as the self-contained registered model; logs and registers it in MLflow.

Runs where the pipeline's register step runs (a Ray worker), in tests and in
benchmarks; no Prefect here. One MLflow model folder holds two flavors:

* ``python_function``: ``classifier_model.py`` (models-from-code) with its network
  ``classifier_network.py`` (``code_paths``), the weights as a state dict, and a
  ``model_config`` with the class names, the normalisation and the architecture: raw
  images in, labels out (``mlflow.pyfunc.load_model``, ``mlflow models serve``);
* ``pytorch``: the plain ``torch.nn.Module`` (the network file's ``ResNet18``; the file ships in
  the version's ``code/`` folder), so ``mlflow.pytorch.load_model`` gives a network to
  fine-tune without this repository or torchvision. MLflow 3 refuses to
  unpickle it unless ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=true``; the pickle-free way
  to the same module is ``mlflow.pyfunc.load_model(uri).unwrap_python_model().network``.

The data set's identity, the recipe and the input/output contract travel as the
model's metadata, tags and descriptions (shown in the MLflow UI).

Example::

    card = ModelCard(dataset=DatasetIdentity.of("fashion-mnist", md5s, source), recipe=recipe_record)
    version = log_and_register(network, card, "fashion-mnist-resnet18", run_id, tracking_uri)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from tasks.domain import classifier_network
from tasks.domain.classifier_network import ARCHITECTURE
from tasks.domain.dataset_registry import get_dataset_spec
from tasks.domain.image_spec import ImageSpec
from tasks.domain.network import MEAN, STD
from trainlib.startup import replaced_attribute

NETWORK_PATH = os.path.abspath(classifier_network.__file__)
_DOMAIN = os.path.dirname(NETWORK_PATH)
# The pyfunc's file, beside the network's; not imported here: it imports mlflow (~1-1.5 s), which only logging a
# version needs, and the pipeline's task process imports this module before its first task.
CODE_PATH = os.path.join(_DOMAIN, "classifier_model.py")
# What the pyfunc's file imports, shipped in the version's code/ folder (code_paths): the network, the image
# shape, the input forms and the preprocessing shared with training.
CODE_PATHS = tuple(
    os.path.join(_DOMAIN, name)
    for name in ("classifier_network.py", "image_spec.py", "image_input.py", "image_preprocessing.py")
)
# The shape of the built-in idx data sets (FashionMNIST, MNIST): what a card without an image spec describes.
IDX_SHAPE = {"channels": 1, "height": 28, "width": 28}
MODEL_ARTIFACT_NAME = "model"
PICKLE_MODULE = "pickle"
# The network file's module name in a version's code/ folder, which classifier_model.py imports and the pytorch
# flavor's pickle names.
NETWORK_MODULE = "classifier_network"
PYTORCH_CODE_DIR = "code"


@dataclasses.dataclass(frozen=True)
class DatasetIdentity:
    """Which data a model was trained and tested on.

    Attributes:
        name: the data set's name, e.g. ``"fashion-mnist"``.
        md5s: filename -> md5 of each file.
        source: where the files came from (a URL or folder; never with credentials).
    """

    name: str
    md5s: Mapping[str, str]
    source: str

    @property
    def digest(self) -> str:
        """One md5 for the whole data set: of its files' ``name:md5`` lines, sorted."""
        lines = "\n".join(f"{k}:{v}" for k, v in sorted(self.md5s.items()))
        return hashlib.md5(lines.encode(), usedforsecurity=False).hexdigest()

    def test_md5(self) -> str:
        """md5s of the test split's files (``t10k-*``), joined: what a test accuracy was measured on."""
        return ",".join(v for k, v in sorted(self.md5s.items()) if k.startswith("t10k-")) or self.digest


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """Everything a registered version records besides its weights.

    Attributes:
        dataset: the training/test data's identity.
        recipe: the training recipe's name and settings (e.g. ``{"name": "augmented", "lr": 0.05}``).
        class_names: label -> class name (default: the image spec's, else the data set registry's).
        mean, std: the normalisation the network was trained with (0..1 scale; one value, or one per channel).
        test_accuracy: the version's test accuracy when known at registration.
        architecture: the network's (a key of ``classifier_network.ARCHITECTURES``).
        image_spec: the images' channels, size and class names (from the data's snapshot); None: a built-in
            idx data set's (gray 28x28, the registry's class names).

    Raises:
        ValueError: ``class_names`` and ``image_spec`` name different classes.
    """

    dataset: DatasetIdentity
    recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    class_names: tuple[str, ...] | None = None
    mean: float | tuple[float, ...] = MEAN
    std: float | tuple[float, ...] = STD
    test_accuracy: float | None = None
    architecture: str = ARCHITECTURE
    image_spec: ImageSpec | None = None

    def __post_init__(self) -> None:
        if self.image_spec and self.class_names and tuple(self.class_names) != self.image_spec.class_names:
            raise ValueError(
                f"ModelCard.class_names {list(self.class_names)} differ from image_spec.class_names "
                f"{list(self.image_spec.class_names)}; pass the image spec only."
            )

    def spec(self) -> ImageSpec:
        """The images the model takes: ``image_spec``, else gray 28x28 with :meth:`names`' classes."""
        if self.image_spec:
            return self.image_spec
        names = tuple(self.class_names) if self.class_names else get_dataset_spec(self.dataset.name).class_names
        return ImageSpec(class_names=names, **IDX_SHAPE)

    def names(self) -> tuple[str, ...]:
        """The class names, in label order."""
        return self.spec().class_names

    def model_config(self) -> dict[str, Any]:
        """What ``classifier_model.ImageClassifier.load_context`` reads: the image spec's fields and more."""
        return {
            **self.spec().record(),
            "mean": _plain(self.mean),
            "std": _plain(self.std),
            "architecture": self.architecture,
        }

    def metadata(self) -> dict[str, Any]:
        """The MLmodel ``metadata``: input/output contract, image spec, data set identity, recipe."""
        return {
            "input": input_text(self.spec()),
            "output": "one row per image: label (int), class (str), probability (float), probabilities "
            f"({len(self.names())} floats, in label order)",
            "class_names": list(self.names()),
            "image": self.spec().record(),
            "normalisation": {"mean": _plain(self.mean), "std": _plain(self.std), "scale": "pixel / 255"},
            "dataset": {
                "name": self.dataset.name,
                "digest": self.dataset.digest,
                "source": self.dataset.source,
                "md5s": dict(self.dataset.md5s),
            },
            "recipe": dict(self.recipe),
        }

    def tags(self) -> dict[str, str]:
        """Version tags: data set, recipe."""
        tags = {
            "dataset": self.dataset.name,
            "dataset_md5": self.dataset.digest,
            "dataset_source": self.dataset.source,
            "recipe": str(self.recipe.get("name", "unknown")),
            "recipe_settings": json.dumps(dict(self.recipe), sort_keys=True),
            "image": describe(self.spec()),
        }
        return {k: v[:5000] for k, v in tags.items()}

    def version_description(self) -> str:
        accuracy = "" if self.test_accuracy is None else f" Test accuracy {self.test_accuracy:.2%}."
        recipe = ", ".join(f"{k}={v}" for k, v in sorted(self.recipe.items()))
        return (
            f"ResNet18 ({self.architecture}, {describe(self.spec())} images) trained on {self.dataset.name} "
            f"(md5 {self.dataset.digest}, from {self.dataset.source}) with recipe: {recipe or 'unknown'}."
            f"{accuracy}\n\n{contract_text(self.spec())}"
        )


def _plain(value: float | tuple[float, ...]) -> float | list[float]:
    return float(value) if isinstance(value, (int, float)) else [float(v) for v in value]


def describe(spec: ImageSpec) -> str:
    """``"gray 28x28"`` or ``"RGB 32x32"``."""
    return f"{'gray' if spec.channels == 1 else 'RGB'} {spec.height}x{spec.width}"


def recorded_image(metadata: Mapping[str, Any]) -> str | None:
    """What a registered version's metadata says it takes, as :func:`describe` writes it (``"gray 28x28"``).

    A version written before image specs records only its ``input`` text: it took gray 28x28 images. None: the
    metadata records neither.
    """
    if isinstance(metadata.get("image"), Mapping):
        return describe(ImageSpec.from_record(dict(metadata["image"])))
    return describe(ImageSpec(class_names=("0", "1"), **IDX_SHAPE)) if metadata.get("input") else None


def input_text(spec: ImageSpec) -> str:
    """What the model takes (``image_input.accepted_input``), imported when a version is written: it imports
    pandas and PIL, which the pipeline's task process does not need before then."""
    from tasks.domain.image_input import accepted_input

    return accepted_input(spec.channels, spec.height, spec.width)


def contract_text(spec: ImageSpec) -> str:
    """What goes in and what comes out, for the registry's descriptions."""
    classes = ", ".join(f"{i}={name}" for i, name in enumerate(spec.class_names))
    return (
        f"Input: {input_text(spec)}; any batch size (numpy, torch, nested lists, a DataFrame, or JSON to mlflow "
        'models serve: {"dataframe_split": {"columns": ["image"], "data": [["<base64 PNG>"]]}} or {"inputs": '
        "[...pixel arrays...]}).\n"
        "Output: one row per image: label (int), class, probability (of the label), probabilities "
        f"(all classes, in label order). Classes: {classes}.\n"
        "Use: mlflow.pyfunc.load_model('models:/<name>@champion').predict(images); the torch.nn.Module: "
        "mlflow.pyfunc.load_model(uri).unwrap_python_model().network, or mlflow.pytorch.load_model(uri) with "
        "MLFLOW_ALLOW_PICKLE_DESERIALIZATION=true."
    )


def registered_model_description(spec: ImageSpec) -> str:
    return (
        f"Image classifier for {describe(spec)} images (ResNet18); each version carries its image spec, "
        f"normalisation, class names and data set identity.\n\n{contract_text(spec)}"
    )


def signature() -> Any:
    """The output schema (label, class, probability, probabilities).

    No input schema on purpose: MLflow's schemas admit one form (a tensor of one dtype and shape, or
    typed columns), while the model takes encoded images or base64 strings in a column ``image`` and
    pixel arrays of any size, uint8 or float, and checks that itself with an error naming the row and
    the accepted forms (the ``input`` of the version's metadata and description). The input example
    shows uint8 pixel arrays of the spec's shape.
    """
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    return ModelSignature(
        inputs=None,
        outputs=Schema(
            [
                ColSpec("long", "label"),
                ColSpec("string", "class"),
                ColSpec("double", "probability"),
                ColSpec(Array("double"), "probabilities"),
            ]
        ),
    )


def input_example(spec: ImageSpec) -> Any:
    """Two uint8 images of the spec's size: ``[2, H, W]`` gray, ``[2, H, W, 3]`` RGB (a batch of two, so nothing
    reads it as 'one image')."""
    import numpy as np

    height, width = spec.height, spec.width
    example = np.zeros((2, height, width) + ((3,) if spec.channels == 3 else ()), dtype=np.uint8)
    # something trouser-shaped, so the example is not all zeros
    example[1, height // 7 : height * 6 // 7, width * 5 // 14 : width * 9 // 14] = 200
    return example


def pip_requirements() -> list[str]:
    import mlflow
    import numpy
    import pandas
    import PIL

    # No torchvision: the model file defines the network itself. Pillow decodes encoded images.
    return [
        f"mlflow=={mlflow.__version__}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={numpy.__version__}",
        f"pandas=={pandas.__version__}",
        f"pillow=={PIL.__version__}",
    ]


@contextlib.contextmanager
def _requirements_of_this_environment() -> Iterator[None]:
    """Inside the block, MLflow's save does not check the model's requirements against this environment.

    :func:`pip_requirements` pins the versions this very process runs, so the check cannot find a
    mismatch. It maps every installed distribution to its modules first, on each process's first
    save: most of the register step's CPU. MLflow's private
    ``environment.warn_dependency_requirement_mismatches`` is replaced for the block; a version of
    MLflow without it runs its own check.
    """
    from mlflow.utils import environment

    with replaced_attribute(environment, "warn_dependency_requirement_mismatches", lambda original: _no_check):
        yield


def _no_check(requirements: list[str]) -> None:
    """MLflow's requirement check, for requirements pinned from this environment: nothing to report."""


class _ClassifierFlavor:
    """A flavor for ``mlflow.models.Model.log``: the pyfunc from code plus the pytorch flavor."""

    __name__ = "python_function"

    def __init__(self, network: torch.nn.Module, card: ModelCard):
        self.network = network
        self.card = card

    def save_model(self, path: str, mlflow_model: Any = None, **_: Any) -> None:
        save_model(self.network, self.card, path, mlflow_model=mlflow_model)


def _network_file() -> types.ModuleType:
    """The network file loaded under its own top-level name (as a version's code folder provides it)."""
    module = sys.modules.get(NETWORK_MODULE)
    if module is None or getattr(module, "__file__", None) != NETWORK_PATH:
        spec = importlib.util.spec_from_file_location(NETWORK_MODULE, NETWORK_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[NETWORK_MODULE] = module  # pickle finds the classes by their module's name
        spec.loader.exec_module(module)
    return module


def save_model(network: torch.nn.Module, card: ModelCard, path: str, mlflow_model: Any = None) -> str:
    """Write the MLflow model folder (both flavors) to ``path``, which must not exist; return ``path``."""
    import mlflow

    network = network.module if hasattr(network, "module") else network  # unwrap DDP
    network = network.cpu().eval()
    # The pytorch flavor's module: the network file's classes holding these weights (see below). Built first,
    # so weights that do not fit the card's architecture fail before anything is written.
    spec = card.spec()
    conv1 = network.state_dict().get("conv1.weight")
    if conv1 is not None and conv1.ndim == 4 and conv1.shape[1] != spec.channels:
        raise ValueError(
            f"The network's conv1 takes {conv1.shape[1]} channels; ModelCard.image_spec.channels is "
            f"{spec.channels}. Build it with build_network(..., in_channels=spec.channels)."
        )
    try:
        portable = _network_file().network_with_weights(network.state_dict(), len(card.names()), card.architecture)
    except RuntimeError as exc:
        raise ValueError(
            f"The network's weights do not fit ModelCard.architecture={card.architecture!r} "
            f"({str(exc).splitlines()[0]}). Pass ModelCard(architecture=...) naming the network that was "
            "trained (the recipe's architecture)."
        ) from None
    with tempfile.TemporaryDirectory() as scratch, _requirements_of_this_environment():
        weights = os.path.join(scratch, "weights.pt")
        torch.save(network.state_dict(), weights)
        mlflow.pyfunc.save_model(
            path=path,
            python_model=CODE_PATH,
            code_paths=list(CODE_PATHS),
            artifacts={"weights": weights},
            model_config=card.model_config(),
            signature=signature(),
            input_example=input_example(spec),
            pip_requirements=pip_requirements(),
            metadata=card.metadata(),
            mlflow_model=mlflow_model,
        )
    # The pytorch flavor: the whole module, as mlflow.pytorch.save_model writes it. Its classes are the network
    # file's, pickled under that file's own name; the file is in the code folder (the pyfunc's code_paths), which
    # mlflow.pytorch.load_model puts on sys.path: a process without this repository (or torchvision) unpickles it.
    data = os.path.join(path, "data")
    os.makedirs(data, exist_ok=True)
    torch.save(portable.eval(), os.path.join(data, "model.pth"))
    with open(os.path.join(data, "pickle_module_info.txt"), "w") as f:
        f.write(PICKLE_MODULE)
    model = mlflow.models.Model.load(path) if mlflow_model is None else mlflow_model
    model.add_flavor("pytorch", model_data="data", pytorch_version=str(torch.__version__), code=PYTORCH_CODE_DIR)
    model.save(os.path.join(path, "MLmodel"))
    return path


@dataclasses.dataclass(frozen=True)
class RegisteredVersion:
    """A registered model version: ``models:/<name>/<version>`` loads it."""

    name: str
    version: str
    model_uri: str
    run_id: str | None


def log_and_register(
    network: torch.nn.Module,
    card: ModelCard,
    model_name: str,
    run_id: str | None,
    tracking_uri: str,
    tags: Mapping[str, str] | None = None,
) -> RegisteredVersion:
    """Log the packaged model into MLflow run ``run_id`` and register it as a new version of ``model_name``.

    Sets the registered model's and the version's descriptions; the version is created with its data
    set and recipe tags and ``tags`` (one registry call, not one per tag).
    """
    import mlflow
    from mlflow import MlflowClient

    from tasks.domain.environ import environment
    from trainlib.mlflow import using_tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri)
    # MLflow files the logged model under the active experiment, else MLFLOW_EXPERIMENT_ID, else the
    # Default one ("0"), not under the run's: without this the model's files went to the Default
    # experiment's artifact root, for a SQLite store without one ./mlruns in the working directory.
    experiment = {"MLFLOW_EXPERIMENT_ID": client.get_run(run_id).info.experiment_id} if run_id else {}
    with using_tracking_uri(tracking_uri), environment(experiment):
        # No validate_serving_input: MLflow would load the model it has just written and predict the input
        # example (~1 s of CPU), a check the tests make on every loader; a failure there is only a warning.
        info = mlflow.models.Model.log(
            artifact_path=None,
            name=MODEL_ARTIFACT_NAME,
            flavor=_ClassifierFlavor(network, card),
            flavor_name="python_function",
            registered_model_name=model_name,
            run_id=run_id,
            tags={**card.tags(), **(tags or {})},
            validate_serving_input=False,
        )
    version = str(info.registered_model_version)
    client.update_registered_model(model_name, description=registered_model_description(card.spec()))
    client.update_model_version(model_name, version, description=card.version_description())
    return RegisteredVersion(
        name=model_name, version=version, model_uri=f"models:/{model_name}/{version}", run_id=run_id
    )
