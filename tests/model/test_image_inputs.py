"""What the registered model takes, and the sources batch scoring reads, without servers (S3 is moto's, in-process).

The one preprocessing against torchvision's resize and PIL's channel conversion; every input form of an RGB and
a gray model (encoded bytes, base64, arrays of any size and layout) giving the same pixels; the errors for bad
client input; image folders and manifests, local and on S3, and a file the model cannot decode named by
``score_chunk``.
"""

from __future__ import annotations

import base64
import os

import numpy as np
import pandas as pd
import pytest
import torch
from model_helpers import encoded, generated_rgb_images

pytestmark = pytest.mark.integration  # moto's server, MLflow's model loading

SPEC_RGB = {"channels": 3, "height": 32, "width": 32}
SPEC_GRAY = {"channels": 1, "height": 28, "width": 28}


def batch(data, channels, height, width):
    from tasks.domain.classifier_model import as_image_batch
    from tasks.domain.image_spec import ImageSpec

    return as_image_batch(data, ImageSpec(channels, height, width, ("a", "b", "c")))


def expected(images_hwc: np.ndarray, channels: int, height: int, width: int) -> torch.Tensor:
    from tasks.domain.image_preprocessing import fit_to_spec

    pixels = torch.from_numpy(np.ascontiguousarray(images_hwc)).permute(0, 3, 1, 2)
    return fit_to_spec(pixels, channels, height, width).float()


def test_resize_is_torchvisions_antialiased_bilinear_resize():
    from torchvision.transforms.v2 import functional

    from tasks.domain.image_preprocessing import resize

    generator = torch.Generator().manual_seed(0)
    for size in ((32, 32), (19, 45), (80, 64)):  # down, mixed, up
        floats = torch.rand(2, 3, 40, 50, generator=generator) * 255
        theirs = functional.resize(floats, list(size), antialias=True)
        torch.testing.assert_close(resize(floats, *size), theirs, atol=1e-3, rtol=0)
        uint8 = floats.round().to(torch.uint8)
        ours = resize(uint8, *size)
        assert ours.dtype == torch.uint8
        difference = (ours.int() - functional.resize(uint8, list(size), antialias=True).int()).abs()
        assert difference.max() <= 1  # the same filter; uint8 kernels round once
    same = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    assert resize(same, 28, 28) is same  # images of the spec's size are not touched


def test_channel_conversion_is_pils_convert():
    from PIL import Image

    from tasks.domain.image_preprocessing import convert_channels, decode_image

    rgba = np.random.default_rng(0).integers(0, 256, (30, 20, 4), dtype=np.uint8)
    as_tensor = torch.from_numpy(rgba.copy()).permute(2, 0, 1)[None]
    picture = Image.fromarray(rgba)
    gray = np.array(picture.convert("L"))
    assert torch.equal(convert_channels(as_tensor[:, :3], 1)[0, 0], torch.from_numpy(gray))  # RGB -> L
    assert torch.equal(convert_channels(as_tensor, 1)[0, 0], torch.from_numpy(gray))  # RGBA -> L
    rgb = np.array(picture.convert("RGB"))
    assert torch.equal(convert_channels(as_tensor, 3)[0].permute(1, 2, 0), torch.from_numpy(rgb))  # alpha dropped
    gray_to_rgb = np.array(Image.fromarray(gray).convert("RGB"))
    assert torch.equal(
        convert_channels(torch.from_numpy(gray)[None, None], 3)[0].permute(1, 2, 0), torch.tensor(gray_to_rgb)
    )
    [png] = encoded(rgba[None, :, :, :3])
    assert torch.equal(decode_image(png, 1)[0], torch.from_numpy(gray))  # decoding converts as the arrays do


def test_every_form_of_the_same_rgb_images_gives_the_same_pixels():
    images, _ = generated_rgb_images(3, 40, 50)
    want = expected(images, **SPEC_RGB)
    pngs = encoded(images)
    texts = [base64.b64encode(data).decode() for data in pngs]
    forms = {
        "png bytes column": pd.DataFrame({"image": pngs, "id": ["a", "b", "c"]}),
        "base64 column (dataframe_split)": pd.DataFrame({"image": texts}),
        "data URLs": pd.DataFrame({"image": [f"data:image/png;base64,{t}" for t in texts]}),
        "inputs: {image: [...]}": {"image": np.array(texts)},
        "inputs: [...]": np.array(texts),
        "TF b64 objects": [{"b64": t} for t in texts],
        "list of bytes": pngs,
        "uint8 [N, H, W, C]": images,
        "uint8 [N, C, H, W]": images.transpose(0, 3, 1, 2),
        "torch [N, C, H, W]": torch.from_numpy(images.transpose(0, 3, 1, 2).copy()),
        "RGBA [N, H, W, 4]": np.concatenate([images, np.full((3, 40, 50, 1), 7, np.uint8)], axis=3),
        "list of single images": list(images),
        "nested lists": images.tolist(),
    }
    for name, form in forms.items():
        got = batch(form, **SPEC_RGB)
        assert got.shape == (3, 3, 32, 32) and got.dtype == torch.float32, name
        assert torch.equal(got, want), name
    floats = batch(images.astype(np.float64), **SPEC_RGB)  # float images resize in float: no rounding
    torch.testing.assert_close(floats, want, atol=0.5, rtol=0)


def test_images_of_different_sizes_and_formats_in_one_call():
    images, _ = generated_rgb_images(3, 40, 50)
    jpeg = encoded(images[:1], "JPEG", size=(64, 48))[0]
    gray_png = encoded(images[1:2, :, :, 0])[0]
    mixed = pd.DataFrame({"image": [jpeg, gray_png, encoded(images[2:])[0]]})
    got = batch(mixed, **SPEC_RGB)
    assert got.shape == (3, 3, 32, 32)
    assert torch.equal(got[2], expected(images[2:], **SPEC_RGB)[0])
    assert torch.equal(got[1, 0], got[1, 2])  # a gray PNG repeated to RGB
    # JPEG is lossy: close to the resized original, not equal
    assert (got[0] - expected(images[:1], **SPEC_RGB)[0]).abs().mean() < 12
    ragged = [images[0], images[1, :20, :30]]  # one call, two sizes
    assert batch(ragged, **SPEC_RGB).shape == (2, 3, 32, 32)


def test_a_gray_model_takes_rgb_and_any_size_and_its_arrays_as_before():
    images, _ = generated_rgb_images(2, 56, 56)
    want = expected(images, **SPEC_GRAY)
    assert torch.equal(batch(pd.DataFrame({"image": encoded(images)}), **SPEC_GRAY), want)
    assert torch.equal(batch(images, **SPEC_GRAY), want)
    pixels = np.random.default_rng(1).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    assert torch.equal(batch(pixels, **SPEC_GRAY), torch.from_numpy(pixels[:, None]).float())  # untouched


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda png: pd.DataFrame({"image": [png, b"GIF89a broken", png]}), ["Row 1", "13 bytes are not a readable"]),
        (lambda png: pd.DataFrame({"image": [png, png, "%%% not base64"]}), ["Row 2", "is not base64"]),
        (lambda png: pd.DataFrame({"picture": [png]}), ["column 'picture'", "named 'image'"]),
        (lambda png: pd.DataFrame({"a": ["x"], "b": ["y"]}), ["no column 'image'", "['a', 'b']"]),
        (lambda png: pd.DataFrame({"image": [png, None]}), ["Row 1 holds no image"]),
        (lambda png: pd.DataFrame({"image": [b""]}), ["Row 0 holds no bytes"]),
        (lambda png: {"pictures": [png], "other": [1]}, ["needs the key 'image'"]),
        (lambda png: np.zeros((32, 32, 3), dtype=np.uint8), ["[32, 32, 3]", "add a batch dimension"]),
        (lambda png: np.zeros((0, 3, 32, 32), dtype=np.uint8), ["no image"]),
        (lambda png: np.full((2, 3, 32, 32), 0.5), ["multiply by 255"]),
        (lambda png: [np.zeros((8, 8)), np.zeros((5, 5, 5, 5))], ["Row 1", "[5, 5, 5, 5]"]),
    ],
)
def test_bad_client_input_names_the_row_and_what_is_accepted(make, words):
    from tasks.domain.classifier_model import ImageInputError

    [png] = encoded(generated_rgb_images(1)[0])
    with pytest.raises(ImageInputError) as info:
        batch(make(png), **SPEC_RGB)
    message = str(info.value)
    for word in [*words, "in a column 'image'", "resized to 32x32"]:
        assert word in message, (word, message)
    if words[0].startswith("Row"):
        assert info.value.row == int(words[0].split()[1])
    assert isinstance(info.value, ValueError)


# -- batch scoring's sources ------------------------------------------------------------------------------------


def write_tree(root, images, layout):
    """``images`` written under ``root`` at the relative paths of ``layout`` (format from the extension)."""
    for image, relative in zip(images, layout, strict=True):
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fmt = "JPEG" if relative.endswith(".jpg") else "PNG"
        with open(path, "wb") as f:
            f.write(encoded([image], fmt)[0])


LAYOUT = ("red/a.png", "green/deep/b.jpg", "blue/c.png", "top.png")


def test_a_folder_source_lists_nested_images_with_their_folders_as_labels(tmp_path):
    from tasks.domain.image_source import read_images

    images, _ = generated_rgb_images(4, 24, 36)
    write_tree(tmp_path / "photos", images, LAYOUT)
    (tmp_path / "photos" / "notes.txt").write_text("not an image: skipped")
    (tmp_path / "photos" / ".hidden.png").write_bytes(b"skipped too")
    source = read_images(str(tmp_path / "photos"))
    assert source.ids == ("blue/c.png", "green/deep/b.jpg", "red/a.png", "top.png")
    assert source.labels == ("blue", "deep", "red", None)
    assert source.pixels is None and len(source.files) == 4
    frame = source.chunk(1, 3).model_input()
    assert list(frame.columns) == ["image"] and len(frame) == 2
    assert torch.equal(batch(frame.iloc[1:], **SPEC_RGB), expected(images[:1], **SPEC_RGB))  # red/a.png


def test_a_manifest_lists_images_relative_to_it_or_by_url(tmp_path):
    from tasks.domain.image_source import read_images

    images, _ = generated_rgb_images(4, 24, 36)
    write_tree(tmp_path / "batch", images, LAYOUT)
    rows = {"path": ["red/a.png", "./blue/c.png", "top.png"], "label": ["red", "blue", ""]}
    pd.DataFrame(rows).to_csv(tmp_path / "batch" / "manifest.csv", index=False)
    pd.DataFrame({"path": ["batch/green/deep/b.jpg"]}).to_parquet(tmp_path / "manifest.parquet")
    csv = read_images(str(tmp_path / "batch" / "manifest.csv"))
    assert csv.ids == ("red/a.png", "./blue/c.png", "top.png") and csv.labels == ("red", "blue", None)
    assert torch.equal(batch(csv.model_input(), **SPEC_RGB)[2], expected(images[3:], **SPEC_RGB)[0])
    parquet = read_images(str(tmp_path / "manifest.parquet"))
    assert parquet.ids == ("batch/green/deep/b.jpg",) and parquet.labels is None


@pytest.mark.parametrize(
    "rows, words",
    [
        ({"path": ["red/a.png", "red/missing.png"]}, "row 1: red/missing.png does not exist"),
        ({"path": ["../outside.png"]}, "row 0: the path '../outside.png' is outside the manifest's folder"),
        ({"path": ["/etc/hostname"]}, "is outside the manifest's folder"),
        ({"path": ["red/a.png", ""]}, "row 1: the 'path' is empty"),
        ({"path": ["notes.txt"]}, "row 0 (notes.txt) is not a readable image"),
        ({"file": ["red/a.png"]}, "has no column 'path' (its columns: ['file'])"),
    ],
)
def test_a_bad_manifest_names_the_row_and_the_fix(tmp_path, rows, words):
    from tasks.domain.image_source import ImageSourceError, read_images

    write_tree(tmp_path, generated_rgb_images(1)[0], ["red/a.png"])
    (tmp_path / "notes.txt").write_text("hello")
    pd.DataFrame(rows).to_csv(tmp_path / "manifest.csv", index=False)
    with pytest.raises(ImageSourceError) as info:
        read_images(str(tmp_path / "manifest.csv"))
    assert words in str(info.value) and str(tmp_path / "manifest.csv") in str(info.value)


def test_folder_and_manifest_sources_on_s3(tmp_path, monkeypatch):
    from faults.fault_helpers import MotoS3

    from tasks.domain.image_source import ImageSourceError, read_images

    images, _ = generated_rgb_images(4, 24, 36)
    write_tree(tmp_path / "photos", images, LAYOUT)
    with MotoS3() as s3:
        options, fs = s3.options(), s3.fs()
        fs.put(str(tmp_path / "photos"), f"{s3.bucket}/photos", recursive=True)
        folder = read_images(f"s3://{s3.bucket}/photos", options)
        assert folder.ids == ("blue/c.png", "green/deep/b.jpg", "red/a.png", "top.png")
        assert folder.labels == ("blue", "deep", "red", None)
        fs.pipe_file(f"{s3.bucket}/photos/manifest.csv", b"path,label\nred/a.png,red\ntop.png,\n")
        manifest = read_images(f"s3://{s3.bucket}/photos/manifest.csv", options)
        assert manifest.ids == ("red/a.png", "top.png") and manifest.labels == ("red", None)
        assert manifest.files[0] == folder.files[2]
        # A local manifest naming objects by URL: the endpoint and credentials come from the environment.
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        (tmp_path / "urls.csv").write_text(f"path\ns3://{s3.bucket}/photos/blue/c.png\n")
        by_url = read_images(str(tmp_path / "urls.csv"))
        assert by_url.ids == (f"s3://{s3.bucket}/photos/blue/c.png",)
        with pytest.raises(ImageSourceError, match="row 0: red/gone.png does not exist"):
            fs.pipe_file(f"{s3.bucket}/bad/manifest.csv", b"path\nred/gone.png\n")
            read_images(f"s3://{s3.bucket}/bad/manifest.csv", options)


@pytest.fixture(scope="module")
def rgb_model_folder(tmp_path_factory):
    """An (untrained) RGB 32x32 model of three classes saved as the registry stores it."""
    from model_helpers import RGB_CLASSES, dataset_identity, default_architecture

    from tasks.domain.classifier_network import build_network
    from tasks.domain.image_spec import ImageSpec
    from tasks.domain.model_card import ModelCard
    from tasks.domain.model_package import save_model

    spec = ImageSpec(class_names=RGB_CLASSES, **SPEC_RGB)
    card = ModelCard(dataset=dataset_identity(), image_spec=spec, architecture=default_architecture())
    network = build_network(3, default_architecture(), in_channels=3)
    return save_model(network, card, str(tmp_path_factory.mktemp("rgb") / "model"))


def test_scoring_a_folder_names_each_file_and_the_file_the_model_cannot_decode(tmp_path, rgb_model_folder):
    from tasks.domain.batch_scoring import PREDICTION_COLUMNS, score_chunk
    from tasks.domain.image_source import ImageSourceError, read_images
    from tasks.domain.scoring_model import ResolvedModel

    images, _ = generated_rgb_images(4, 24, 36)
    write_tree(tmp_path / "photos", images, LAYOUT)
    model = ResolvedModel("rgb", "champion", "1", tracking_uri=str(tmp_path / "mlruns"), source=rgb_model_folder)
    frame = score_chunk(model, read_images(str(tmp_path / "photos"))).frame
    assert list(frame.columns) == list(PREDICTION_COLUMNS)
    assert frame["image_id"].tolist() == ["blue/c.png", "green/deep/b.jpg", "red/a.png", "top.png"]
    assert frame["source_label"].tolist()[:3] == ["blue", "deep", "red"] and pd.isna(frame["source_label"][3])
    assert set(frame["class"]) <= {"red", "green", "blue"}
    # A PNG cut short: its header reads (the read step passes it), its pixels do not decode.
    whole = (tmp_path / "photos" / "red" / "a.png").read_bytes()
    (tmp_path / "photos" / "red" / "a.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImageSourceError) as info:
        score_chunk(model, read_images(str(tmp_path / "photos")))
    assert f"{tmp_path / 'photos'}: red/a.png: its" in str(info.value) and "Row" not in str(info.value)


def test_a_champion_of_other_images_is_not_compared():
    from tasks.domain.champion import ChampionMismatchError, check_same_data
    from tasks.domain.image_spec import ImageSpec
    from tasks.domain.model_card import recorded_image

    rgb = ImageSpec(class_names=("a", "b", "c"), **SPEC_RGB)
    assert recorded_image({"image": rgb.record(), "input": "..."}) == "RGB 32x32"
    assert recorded_image({"input": "uint8 images shaped [N, 28, 28]"}) == "gray 28x28"  # before image specs
    assert recorded_image({}) is None
    check_same_data("m", "1", "d", None, None, None, "gray 28x28", recorded_image({"input": "old"}))
    with pytest.raises(ChampionMismatchError, match="it takes 'RGB 32x32', this run's model 'gray 28x28'"):
        check_same_data("m", "1", "d", None, None, None, "gray 28x28", recorded_image({"image": rgb.record()}))
