"""What a registered version records besides its weights: the model card and the texts made from it.

Plain data and text, no mlflow at import; runs wherever a version is described: the evaluate and register
steps (Ray workers), the data steps that record a data set's identity, tests and benchmarks.
:class:`ModelCard` gives the packaged model's ``model_config`` (what ``classifier_model.ImageClassifier``
reads), its MLmodel ``metadata``, the version's tags and the registry's descriptions;
:func:`recorded_image` reads back what an earlier version's metadata says it takes.
:mod:`tasks.domain.model_package` writes them into the model folder.

Example::

    card = ModelCard(dataset=DatasetIdentity("fashion-mnist", md5s, source), recipe=recipe_record)
    card.tags()["dataset_md5"]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tasks.domain.classifier_network import ARCHITECTURE
from tasks.domain.dataset_registry import get_dataset_spec
from tasks.domain.image_spec import ImageSpec
from tasks.domain.network import MEAN, STD

# The shape of the built-in idx data sets (FashionMNIST, MNIST): what a card without an image spec describes.
IDX_SHAPE = {"channels": 1, "height": 28, "width": 28}


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
