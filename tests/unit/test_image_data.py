"""Pure pieces of the user-data path: pixels at an ImageSpec, normalisation and augmentation of color batches,
shards of equal length, the content-hash split, and a source URL's credentials kept out of messages and parameters.
Torch, PIL and pydantic only."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_decoding_converts_channels_and_resizes_to_the_spec():
    from tasks.domain.image_decode import decode_to_spec, inspect_image

    rgb = np.zeros((10, 20, 3), dtype=np.uint8)
    rgb[..., 0] = 255
    data = _png(rgb)
    assert inspect_image(data).channels == 3 and (inspect_image(data).width, inspect_image(data).height) == (20, 10)
    assert decode_to_spec(data, 3, 10, 20).shape == (3, 10, 20)
    assert decode_to_spec(data, 3, 10, 20)[0].min() == 255
    gray = decode_to_spec(data, 1, 16, 16)
    assert gray.shape == (1, 16, 16) and gray.dtype == torch.uint8
    assert inspect_image(b"").error == "empty file (0 bytes)"
    assert "not a decodable image" in inspect_image(b"GIF89a not really").error


def test_png_jpeg_and_webp_decode_to_the_spec_in_both_channel_counts():
    from tasks.domain.image_decode import decode_to_spec, inspect_image

    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    for fmt in ("PNG", "JPEG", "WEBP"):
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format=fmt)
        data = buffer.getvalue()
        assert (inspect_image(data).width, inspect_image(data).channels) == (30, 3), fmt
        assert decode_to_spec(data, 1, 16, 16).shape == (1, 16, 16), fmt
        assert decode_to_spec(data, 3, 20, 30).shape == (3, 20, 30), fmt


def test_color_batches_are_normalised_and_augmented_alike_in_every_channel():
    from tasks.domain.network import to_inputs
    from tasks.domain.recipe import RECIPES, augment_batch

    images = torch.randint(0, 256, (4, 3, 12, 12), dtype=torch.uint8)
    inputs = to_inputs(images)
    assert inputs.shape == (4, 3, 12, 12) and to_inputs(images[:, 0]).shape == (4, 1, 12, 12)
    same = inputs[:, :1].repeat(1, 3, 1, 1)  # three equal channels stay equal: one crop and flip per image
    out = augment_batch(same, RECIPES["augmented"], background=-1.0)
    assert out.shape == same.shape and torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])


def test_shards_have_equal_lengths_and_cover_every_image():
    from tasks.domain.snapshot_loading import shard_indices

    indices = torch.arange(10)
    shards = [shard_indices(indices, rank, 3) for rank in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert set(torch.cat(shards).tolist()) == set(range(10))


def test_the_split_of_an_image_without_one_follows_its_content():
    import hashlib

    from tasks.domain.snapshot import TEST_FRACTION, split_by_hash

    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4000)]
    share = sum(split_by_hash(h) == "test" for h in hashes) / len(hashes)
    assert abs(share - TEST_FRACTION) < 0.03
    assert all(split_by_hash(h) == split_by_hash(h) for h in hashes[:10])


def test_a_source_url_with_credentials_is_refused_and_never_quoted_in_a_message():
    import pytest

    from flows.params import PipelineParams, PipelineParamsError
    from tasks.domain.data_source import describe_access_error

    # botocore quotes the bucket name it could not parse: the user-info of s3://KEY:SECRET@bucket with it.
    location = "s3://AKIAX:top%2Fsecret@bucket/pets"
    parsed = ValueError('Invalid bucket name "AKIAX:top/secret@bucket": Bucket name must match the regex')
    raw = ValueError('Invalid bucket name "AKIAX:top%2Fsecret@bucket"')
    for exc in (parsed, raw):
        message = str(describe_access_error(location, exc))
        assert "secret" not in message and "Invalid bucket name" in message and "Fix:" in message, message
    # The flow run's parameters would keep it in clear: refused, masked, with where credentials go instead.
    with pytest.raises(PipelineParamsError) as info:
        PipelineParams.parse({"data": "https://bob:hunter2@labels.example/pets.csv"})
    assert "data='https://bob:[REDACTED]@labels.example/pets.csv' holds credentials" in str(info.value)
    assert "hunter2" not in str(info.value) and "AWS_ACCESS_KEY_ID" in str(info.value)
