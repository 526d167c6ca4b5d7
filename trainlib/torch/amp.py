"""Automatic mixed precision: ``accelerate``, ``prepare_optimizer``, ``backward``. Runs in worker actors only.

Ray Train's v1 contract (Ray 2.60 still exports these names; its v2 trainer
makes them raise a DeprecationWarning, trainlib keeps them working):

    trainlib.torch.accelerate(amp=True)        # first, before any prepare_* call
    model = trainlib.torch.prepare_model(model)  # forward now runs under autocast
    optimizer = trainlib.torch.prepare_optimizer(optimizer)
    trainlib.torch.backward(loss)              # scaled backward
    optimizer.step()                           # unscale, step, update the scale

On a GPU autocast uses float16 with a dynamic loss scale; on the CPU it uses
bfloat16, which needs no loss scale (``backward`` is then a plain backward).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch


@dataclasses.dataclass
class _Accelerator:
    """This process's AMP settings; one per worker process, set once by ``accelerate``."""

    amp: bool
    scaler: Any = None  # torch.amp.GradScaler on GPUs with amp, else None

    def autocast(self, device: torch.device):
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        return torch.autocast(device_type=device.type, dtype=dtype, enabled=self.amp)


_accelerator: _Accelerator | None = None
_prepared = False  # a prepare_* call happened: accelerate() may no longer change the settings


def accelerate(amp: bool = False) -> None:
    """Turn on training optimisations for this worker; today: automatic mixed precision.

    Call it once, at the top of the training function, before ``prepare_model``,
    ``prepare_data_loader`` and ``prepare_optimizer``.

    Args:
        amp: train with automatic mixed precision (float16 with loss scaling on a
            GPU, bfloat16 on the CPU).

    Raises:
        RuntimeError: called twice, or after a ``prepare_*`` call.
    """
    global _accelerator
    if not isinstance(amp, bool):
        raise TypeError(f"accelerate(amp={amp!r}): amp must be True or False.")
    if _accelerator is not None or _prepared:
        raise RuntimeError(
            "An accelerator has already been set. Call trainlib.torch.accelerate() once, before "
            "prepare_model(), prepare_data_loader() and prepare_optimizer()."
        )
    from trainlib.torch.devices import get_device

    device = get_device()
    scaler = torch.amp.GradScaler(device.type) if amp and device.type == "cuda" else None
    _accelerator = _Accelerator(amp=amp, scaler=scaler)


def current() -> _Accelerator:
    """The accelerator of this process (a no-AMP default when ``accelerate`` was not called)."""
    global _accelerator, _prepared
    _prepared = True
    if _accelerator is None:
        _accelerator = _Accelerator(amp=False)
    return _accelerator


def reset() -> None:
    """Forget the settings (a new attempt in the same process starts clean)."""
    global _accelerator, _prepared
    _accelerator = None
    _prepared = False


def autocast_forward(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Run ``model.forward`` under autocast when AMP is on; the model still pickles and saves as before."""
    accelerator = current()
    if not accelerator.amp:
        return model
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast(device):
            return original(*args, **kwargs)

    model.forward = forward  # an instance attribute: state_dict() is unchanged
    return model


class _AmpOptimizer(torch.optim.Optimizer):
    """An optimizer whose ``step`` unscales, skips steps with inf/NaN gradients and updates the loss scale."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any):
        # No super().__init__: every optimizer attribute is the wrapped optimizer's.
        self.optimizer = optimizer
        self.scaler = scaler

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self):  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def defaults(self):  # type: ignore[override]
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        if self.scaler is None:
            return self.optimizer.step(closure)
        result = self.scaler.step(self.optimizer, closure)
        self.scaler.update()
        return result

    def __repr__(self) -> str:
        return f"AmpOptimizer({self.optimizer!r})"


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` works with the AMP loss scale set up by :func:`accelerate`.

    Without AMP, or on the CPU (bfloat16 needs no loss scale), the wrapper only
    forwards to ``optimizer``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"prepare_optimizer() takes a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    return _AmpOptimizer(optimizer, current().scaler)


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, with the loss scaled when AMP with a loss scale is on.

    Use it in place of ``loss.backward()`` together with :func:`prepare_optimizer`.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"backward() takes the loss tensor, got {type(tensor).__name__}.")
    scaler = current().scaler
    if scaler is None:
        tensor.backward()
    else:
        scaler.scale(tensor).backward()
