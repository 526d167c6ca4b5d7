"""What the registered model's ``predict`` takes, turned into pixels of the model's shape.

Runs wherever a registered version predicts (a user's process, ``mlflow models serve``, batch-scoring
workers). Shipped with every version (``code_paths``) beside ``classifier_model.py``: numpy, pandas,
torch, PIL (through ``image_preprocessing``) only; no mlflow, so that ``model_card`` can name
:func:`accepted_input` without importing it.

Accepted, in one call (any batch size, any image size: every image goes through
``image_preprocessing.fit_to_spec``):

* encoded images (PNG, JPEG, ... gray or RGB) as ``bytes``, or base64 strings of them (what JSON
  carries), in a DataFrame column ``image`` (``mlflow models serve``: ``dataframe_split`` /
  ``dataframe_records``), a dict ``{"image": [...]}`` (``{"inputs": {"image": [...]}}``), or a plain
  list of them (``{"inputs": [...]}``); a ``data:image/png;base64,`` prefix and TF-serving's
  ``{"b64": "..."}`` objects are accepted;
* pixel arrays, uint8 or float with values 0..255: ``[N, H, W]`` (gray), ``[N, H, W, C]`` or
  ``[N, C, H, W]`` (C = 1, 3 or 4); ``[N, H*W]`` rows for a gray model of that size; a list (or a
  DataFrame column) of single images of different sizes.

Example::

    pixels = image_batch(pd.DataFrame({"image": [png_bytes, jpeg_bytes]}), channels=3, height=32, width=32)
    pixels.shape  # torch.Size([2, 3, 32, 32]), float32, 0..255
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import pandas as pd
import torch

if __package__:  # this repository's tasks.domain
    from .image_preprocessing import ARRAY_CHANNELS, decode_image, fit_to_spec
else:  # a registered version's code/ folder
    from image_preprocessing import ARRAY_CHANNELS, decode_image, fit_to_spec

IMAGE_COLUMN = "image"  # the DataFrame column (or dict key) holding encoded images
_ENCODED = (bytes, bytearray, memoryview, str)


class InputFormError(ValueError):
    """The input is not one of the accepted forms; ``row`` is the offending image's position, when one is."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


def accepted_input(channels: int, height: int, width: int) -> str:
    """One sentence naming every accepted input form, for error messages and the registry's descriptions."""
    kind = "gray" if channels == 1 else "RGB"
    flat = f", [N, {height * width}] rows" if channels == 1 else ""
    return (
        f"PNG or JPEG images (bytes, or base64 strings in JSON) in a column {IMAGE_COLUMN!r}; or pixel arrays "
        f"(uint8, or float with values 0..255) shaped [N, H, W], [N, H, W, C] or [N, C, H, W] with C = 1, 3 or 4"
        f"{flat}; any size and channels: each image is converted to {kind} and resized to {height}x{width}"
    )


def image_batch(data: Any, channels: int, height: int, width: int) -> torch.Tensor:
    """Any accepted input -> float32 ``[N, channels, height, width]`` pixel values 0..255.

    Raises:
        InputFormError: not an accepted form (wrong column, undecodable bytes, bad base64, a wrong shape,
            dtype or range, no image); the message names the row when one image is at fault, and what is accepted.
    """
    accepted = accepted_input(channels, height, width)
    values = _values(data, accepted)
    if isinstance(values, list):
        if not values:
            raise InputFormError(f"The input holds no image; send {accepted}.")
        return torch.cat([_one(value, row, channels, height, width, accepted) for row, value in enumerate(values)])
    return fit_to_spec(_batch(values, channels, height, width, accepted), channels, height, width).to(torch.float32)


def _one(value: Any, row: int, channels: int, height: int, width: int, accepted: str) -> torch.Tensor:
    """One image of a list (encoded, or a pixel array of its own size) -> float32 ``[1, channels, height, width]``."""
    if isinstance(value, _ENCODED) or _is_b64_object(value):
        images = _decoded(_encoded_bytes(value, row, accepted), row, channels, accepted)
    else:
        images = _single(value, row, accepted)
    return fit_to_spec(images, channels, height, width).to(torch.float32)


def _decoded(data: bytes, row: int, channels: int, accepted: str) -> torch.Tensor:
    if not data:
        raise InputFormError(f"Row {row} holds no bytes (an empty image); send {accepted}.", row)
    try:
        return decode_image(data, channels)[None]
    except Exception as exc:  # noqa: BLE001 - whatever the decoder says of a client's bytes becomes one message
        if type(exc).__name__ == "UnidentifiedImageError":  # its text names an io.BytesIO object, not the bytes
            reason = "no known image format: not PNG, JPEG, WebP, ..."
        else:
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        raise InputFormError(
            f"Row {row}: its {len(data)} bytes are not a readable image ({reason}); send {accepted}.", row
        ) from None


def _values(data: Any, accepted: str) -> np.ndarray | list:
    """A numeric array of a whole batch, or a list with one value per image."""
    if isinstance(data, torch.Tensor):
        return data.detach().cpu().numpy()
    if isinstance(data, pd.DataFrame):
        return _frame_values(data, accepted)
    if isinstance(data, pd.Series):
        return list(data)
    if isinstance(data, dict):
        if IMAGE_COLUMN in data:
            return _values(data[IMAGE_COLUMN], accepted)
        if len(data) != 1:
            raise InputFormError(
                f"A dict input needs the key {IMAGE_COLUMN!r}, got keys {sorted(data)}; send {accepted}."
            )
        return _values(next(iter(data.values())), accepted)
    if isinstance(data, (list, tuple)):
        if data and all(isinstance(v, _ENCODED) or _is_b64_object(v) for v in data):
            return list(data)
        data = _array(data, accepted)
    if isinstance(data, np.ndarray):
        if data.dtype.kind in "SU" or data.dtype == object and data.ndim == 1:
            return list(data)
        return data
    raise InputFormError(f"Cannot read {type(data).__name__} as images; send {accepted}.")


def _frame_values(frame: pd.DataFrame, accepted: str) -> np.ndarray | list:
    if IMAGE_COLUMN in frame.columns:
        return list(frame[IMAGE_COLUMN])
    if frame.shape[1] == 1:  # one column of another name: arrays, one image per row
        values = list(frame.iloc[:, 0])
        if values and any(isinstance(v, _ENCODED) for v in values):
            raise InputFormError(
                f"The DataFrame's column {str(frame.columns[0])!r} holds bytes or strings; put encoded images "
                f"in a column named {IMAGE_COLUMN!r}. Send {accepted}."
            )
        return values
    if len(frame.columns) and all(pd.api.types.is_numeric_dtype(t) for t in frame.dtypes):
        return frame.to_numpy()  # pixel columns, one image per row
    raise InputFormError(
        f"The DataFrame has no column {IMAGE_COLUMN!r} (its columns: {[str(c) for c in frame.columns][:10]}); "
        f"send {accepted}."
    )


def _array(data: Any, accepted: str) -> np.ndarray:
    try:
        return np.asarray(data)
    except (TypeError, ValueError):  # ragged nested lists
        try:
            return np.asarray(data, dtype=object)
        except (TypeError, ValueError):
            raise InputFormError(f"Cannot read {type(data).__name__} as images; send {accepted}.") from None


def _is_b64_object(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _encoded_bytes(value: Any, row: int, accepted: str) -> bytes:
    if _is_b64_object(value):
        value = value["b64"]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    text = value.strip()
    if text.startswith("data:") and "," in text:  # a data URL: data:image/png;base64,....
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InputFormError(
            f"Row {row}: the string {_preview(text)} is not base64 ({exc}); strings must be base64 of PNG or JPEG "
            f"bytes. Send {accepted}.",
            row,
        ) from None


def _preview(text: str) -> str:
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def _single(value: Any, row: int, accepted: str) -> torch.Tensor:
    """One image's pixels (``[H, W]``, ``[H, W, C]`` or ``[C, H, W]``) -> ``[1, C, H, W]``."""
    if value is None or isinstance(value, float) and np.isnan(value):
        raise InputFormError(f"Row {row} holds no image (an empty value); send {accepted}.", row)
    array = _checked(_array(value, accepted), accepted, row)
    shape = list(array.shape)
    if array.ndim == 2:
        array = array[None]
    elif array.ndim == 3 and shape[2] in ARRAY_CHANNELS:
        array = array.transpose(2, 0, 1)
    elif not (array.ndim == 3 and shape[0] in ARRAY_CHANNELS):
        raise InputFormError(f"Row {row}: an image of shape {shape} is not accepted; send {accepted}.", row)
    return torch.from_numpy(np.ascontiguousarray(array))[None]


def _batch(array: np.ndarray, channels: int, height: int, width: int, accepted: str) -> torch.Tensor:
    """A whole batch's array -> ``[N, C, H, W]``."""
    shape = list(array.shape)
    array = _checked(array, accepted, None)
    if array.ndim == 2 and channels == 1 and shape[1] == height * width:
        array = array.reshape(shape[0], 1, height, width)
    elif array.ndim == 3 and shape[2] not in ARRAY_CHANNELS:
        array = array[:, None]
    elif array.ndim == 4 and shape[1] in ARRAY_CHANNELS:
        pass
    elif array.ndim == 4 and shape[3] in ARRAY_CHANNELS:
        array = array.transpose(0, 3, 1, 2)
    else:
        one = array.ndim in (2, 3) and (array.ndim == 2 or shape[2] in ARRAY_CHANNELS)
        hint = " (one image? add a batch dimension: images[None])" if one else ""
        raise InputFormError(f"Input shape {shape} is not accepted{hint}; send {accepted}.")
    if array.shape[0] == 0:
        raise InputFormError(f"The input holds no image; send {accepted} with N >= 1.")
    return torch.from_numpy(np.ascontiguousarray(array))


def _checked(array: np.ndarray, accepted: str, row: int | None) -> np.ndarray:
    """``array`` as uint8 (integers) or float32 pixel values 0..255; refused: non-numbers, values outside 0..255
    or in 0..1."""
    where = "" if row is None else f"Row {row}: "
    if array.dtype == object:
        try:
            array = np.asarray(array.tolist(), dtype=np.float64)
        except (TypeError, ValueError):
            raise InputFormError(
                f"{where}The input holds non-numeric or ragged values; send {accepted}.", row
            ) from None
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise InputFormError(f"{where}Input dtype {array.dtype} is not an image dtype; send {accepted}.", row)
    if array.dtype == np.uint8 or array.size == 0:
        return array
    low, high = float(array.min()), float(array.max())
    if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high > 255:
        raise InputFormError(
            f"{where}Pixel values span {low:g}..{high:g}; expected values 0..255. Send {accepted}.", row
        )
    if 0 < high <= 1:  # an image already scaled to 0..1 would be read as nearly black: refuse, not guess
        raise InputFormError(
            f"{where}Pixel values span {low:g}..{high:g}: they look scaled to 0..1; multiply by 255. Send {accepted}.",
            row,
        )
    if np.issubdtype(array.dtype, np.integer):  # e.g. JSON's integers: uint8 pixels, resized as training's are
        return array.astype(np.uint8)
    return array.astype(np.float32, copy=False)
