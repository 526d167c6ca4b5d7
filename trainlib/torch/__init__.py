"""trainlib.torch: the PyTorch trainer and the helpers used inside the training function.

Example:
    >>> from trainlib.torch import TorchTrainer, prepare_model, prepare_data_loader
"""

from trainlib.torch._backend import TorchConfig
from trainlib.torch._prepare import prepare_data_loader, prepare_model
from trainlib.torch._trainer import TorchTrainer
from trainlib.torch.amp import accelerate, backward, prepare_optimizer
from trainlib.torch.devices import get_device, get_devices
from trainlib.torch.reproducibility import enable_reproducibility

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
