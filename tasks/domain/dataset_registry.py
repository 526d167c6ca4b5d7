"""The data sets the pipeline knows: files with their md5s, official mirrors, class names. Runs anywhere.

Example::

    spec = get_dataset_spec("fashion-mnist")
    spec.mirrors, spec.class_names[0]  # (...), "T-shirt/top"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A known data set: its files with their md5s, its official mirrors and its class names.

    Attributes:
        name: registry key, e.g. ``"fashion-mnist"``.
        files: ``(filename, md5)`` pairs.
        mirrors: base URLs; a file's URL is ``mirror + filename``.
        class_names: the name of each label, in label order.
    """

    name: str
    files: tuple[tuple[str, str], ...]
    mirrors: tuple[str, ...]
    class_names: tuple[str, ...]

    @property
    def md5s(self) -> dict[str, str]:
        """filename -> md5."""
        return dict(self.files)


# The four files of (Fashion-)MNIST, in the order of the md5s below.
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType(
    {
        "fashion-mnist": DatasetSpec(
            name="fashion-mnist",
            files=tuple(
                zip(
                    MNIST_FILES,
                    (
                        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                        "25c81989df183df01b3e8a0aad5dffbe",
                        "bef4ecab320f06d8554ea6380940ec79",
                        "bb300cfdad3c16e7a12a480ee83cd310",
                    ),
                )
            ),
            mirrors=(
                "https://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            ),
            class_names=(
                "T-shirt/top",
                "Trouser",
                "Pullover",
                "Dress",
                "Coat",
                "Sandal",
                "Shirt",
                "Sneaker",
                "Bag",
                "Ankle boot",
            ),
        ),
        # torchvision.datasets.MNIST's mirrors and md5s.
        "mnist": DatasetSpec(
            name="mnist",
            files=tuple(
                zip(
                    MNIST_FILES,
                    (
                        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                        "d53e105ee54ea40749a09fcbcd1e9432",
                        "9fb629c4189551a2d022fa330f9573f3",
                        "ec29112dd5afa0611ce80d1b7f02629c",
                    ),
                )
            ),
            mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
            class_names=tuple(str(d) for d in range(10)),
        ),
    }
)

DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)


def get_dataset_spec(name: str) -> DatasetSpec:
    """Return the registry entry of data set ``name``.

    Raises:
        ValueError: ``name`` is not a known data set; the message lists the known ones.

    Example::

        get_dataset_spec("fashion-mnist").mirrors
    """
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(n) for n in sorted(DATASETS))
        raise ValueError(f"Unknown data set {name!r}. Known data sets: {known}.") from None
