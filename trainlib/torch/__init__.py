"""trainlib.torch: the PyTorch trainer (driver) and the helpers used inside the training function (workers).

Example:
    >>> from trainlib.torch import TorchTrainer, prepare_model, prepare_data_loader
"""

from trainlib.torch.amp import accelerate, backward, prepare_optimizer
from trainlib.torch.config import TorchConfig
from trainlib.torch.devices import get_device, get_devices
from trainlib.torch.prepare import prepare_data_loader, prepare_model
from trainlib.torch.reproducibility import enable_reproducibility
from trainlib.torch.trainer import TorchTrainer

__all__ = [
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


def __getattr__(name: str):
    # A Ray Train name that trainlib does not have: an ImportError saying what to use instead.
    from trainlib._internal.not_built import not_built

    raise not_built(__name__, name)
