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
model's metadata, tags and descriptions (shown in the MLflow UI): the :class:`ModelCard` of
:mod:`tasks.domain.model_card` gives them; this module writes them with the files.

Example::

    card = ModelCard(dataset=DatasetIdentity("fashion-mnist", md5s, source), recipe=recipe_record)
    version = log_and_register(network, card, "fashion-mnist-resnet18", run_id, tracking_uri)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from tasks.domain import classifier_network
from tasks.domain.image_spec import ImageSpec
from tasks.domain.model_card import ModelCard, registered_model_description
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
MODEL_ARTIFACT_NAME = "model"
PICKLE_MODULE = "pickle"
# The network file's module name in a version's code/ folder, which classifier_model.py imports and the pytorch
# flavor's pickle names.
NETWORK_MODULE = "classifier_network"
PYTORCH_CODE_DIR = "code"


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
