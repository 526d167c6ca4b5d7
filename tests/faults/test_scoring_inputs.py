"""Batch scoring's bad inputs and outputs, on real files: NaN and 0..1 floats refused, pipes and devices refused at
once, decompression bounded, every decode error names the file, and the output location is checked before scoring
(an existing output is kept unless overwrite=True)."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from tasks.domain import image_source
from tasks.domain.image_source import ImageSourceError, read_images, write_png_folder
from tasks.domain.predictions_file import OutputLocationError, check_output_location

pytestmark = [pytest.mark.timeout(60)]


def _npy(tmp_path, array, name="images.npy"):
    path = tmp_path / name
    np.save(path, array)
    return str(path)


def test_nan_and_zero_to_one_floats_are_refused_naming_the_file(tmp_path):
    nan = np.full((3, 28, 28), 128.0)
    nan[2, 5, 5] = np.nan
    with pytest.raises(ImageSourceError, match=r"nan\.npy holds NaN or infinite values \(first at image 2\)"):
        read_images(_npy(tmp_path, nan, "nan.npy"))
    unit = np.random.default_rng(0).random((3, 28, 28)).astype(np.float32)
    with pytest.raises(ImageSourceError, match=r"unit\.npy holds float32 values in 0\.\.1.*\* 255"):
        read_images(_npy(tmp_path, unit, "unit.npy"))
    assert read_images(_npy(tmp_path, unit * 255, "scaled.npy")).pixels.dtype == np.uint8


def test_pipes_and_devices_are_refused_at_once(tmp_path):
    fifo = tmp_path / "images.npy"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    with pytest.raises(ImageSourceError, match="is not a regular file"):
        read_images(str(fifo))
    with pytest.raises(ImageSourceError, match="is not a regular file"):
        read_images("/dev/zero")


def test_decompression_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(image_source, "MAX_INPUT_BYTES", 1 << 20)
    bomb = tmp_path / "t10k-images-idx3-ubyte.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (4 << 20)))  # 4 KB that expands to 4 MB
    with pytest.raises(ImageSourceError, match=r"t10k-images-idx3-ubyte\.gz expands to more than 1048576 bytes"):
        read_images(str(bomb))


def test_a_decompression_bomb_png_is_named(tmp_path, monkeypatch):
    from PIL import Image

    folder = tmp_path / "pngs"
    write_png_folder(np.zeros((2, 28, 28), dtype=np.uint8), str(folder))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 28x28 is then more than twice the limit: a "bomb"
    with pytest.raises(ImageSourceError, match=r"image_00000\.png is not a readable image \(DecompressionBombError"):
        read_images(str(folder))


def test_the_output_location_is_checked_before_scoring(tmp_path):
    existing = tmp_path / "predictions.csv"
    existing.write_text("image_id,label\n")
    with pytest.raises(OutputLocationError, match="exists already.*overwrite=True"):
        check_output_location(str(existing))
    check_output_location(str(existing), overwrite=True)
    assert existing.read_text() == "image_id,label\n"  # only checked, not touched
    blocked = tmp_path / "a_file"  # a file where the output's folder should be: no user can write there
    blocked.write_text("")
    with pytest.raises(OutputLocationError, match=r"Cannot write the output .*a_file/p\.parquet.*nothing was scored"):
        check_output_location(str(blocked / "p.parquet"))
    check_output_location(str(tmp_path / "new" / "p.parquet"))
    assert os.listdir(tmp_path / "new") == []  # the probe file is gone
