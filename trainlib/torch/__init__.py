"""trainlib.torch: the PyTorch trainer (driver) and the helpers used inside the training function (workers).

Example:
    >>> from trainlib.torch import TorchTrainer, prepare_model, prepare_data_loader
"""

from trainlib.torch.config import TorchConfig
from trainlib.torch.prepare import get_device, prepare_data_loader, prepare_model
from trainlib.torch.trainer import TorchTrainer

__all__ = ["TorchConfig", "TorchTrainer", "get_device", "prepare_data_loader", "prepare_model"]
