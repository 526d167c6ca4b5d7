"""What a model's images are: channels, size and class names. Runs anywhere (driver, workers, a loaded model).

The one object that carries the data's shape from the snapshot (``tasks.domain.snapshot``) to the
network (``classifier_network.build_network``), the registered model's ``model_config`` and the
scoring input checks. Plain data: ``record()``/``from_record()`` give the JSON form stored with
a model version.

Example::

    spec = ImageSpec(channels=3, height=32, width=32, class_names=("cat", "dog", "fox"))
    spec.num_classes          # 3
    ImageSpec.from_record(spec.record()) == spec
"""

from __future__ import annotations

import dataclasses
from typing import Any

CHANNEL_MODES = {1: "L", 3: "RGB"}  # channels -> the PIL mode images are converted to


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """The images a model is trained on and takes.

    Attributes:
        channels: 1 (gray) or 3 (RGB); every image is converted to it.
        height, width: the size every image is resized to (training and serving alike).
        class_names: label -> class name, in label order.

    Raises:
        ValueError: a field is out of range; the message names the field and the fix.
    """

    channels: int
    height: int
    width: int
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.channels not in CHANNEL_MODES:
            raise ValueError(f"ImageSpec.channels is {self.channels!r}; use 1 (gray) or 3 (RGB).")
        for name in ("height", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 8:
                raise ValueError(f"ImageSpec.{name} is {value!r}; use a whole number of pixels >= 8.")
        if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
            raise ValueError(
                f"ImageSpec.class_names is {list(self.class_names)!r}; a classifier needs at least two distinct classes."
            )
        object.__setattr__(self, "class_names", tuple(str(n) for n in self.class_names))

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def mode(self) -> str:
        """The PIL mode images are converted to: ``"L"`` or ``"RGB"``."""
        return CHANNEL_MODES[self.channels]

    def record(self) -> dict[str, Any]:
        """The JSON form, as stored in a model version's ``model_config``."""
        return {
            "channels": self.channels,
            "height": self.height,
            "width": self.width,
            "class_names": list(self.class_names),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ImageSpec:
        return cls(
            channels=int(record["channels"]),
            height=int(record["height"]),
            width=int(record["width"]),
            class_names=tuple(record["class_names"]),
        )
