"""Fast tests of the model's plain parts: the self-contained model file, input checks, the scoring reader and
writer, the recipes, and the promotion rule with a margin. No servers (S3 is moto's, in-process)."""

from __future__ import annotations

import ast
import dataclasses
import gzip
import os
import struct
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO_ROOT, TESTS_DIR, free_port
from malloc_probe import PAGES

MODEL_FILE = os.path.join(REPO_ROOT, "tasks", "domain", "classifier_model.py")
NETWORK_FILE = os.path.join(REPO_ROOT, "tasks", "domain", "classifier_network.py")


def _imports(path):
    imported = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    return imported


def test_model_files_import_only_what_a_fresh_environment_has():
    from tasks.domain.model_package import CODE_PATH, CODE_PATHS

    # The network file: torch and the standard library only, so training's workers build the network without
    # importing mlflow.
    assert {name.split(".")[0] for name in _imports(NETWORK_FILE)} - set(sys.stdlib_module_names) == {"torch"}
    # The model file and the files shipped beside it (code_paths): each other (a registered version's copies, or
    # this repository's while MLflow saves one) and what the version's requirements pin, nothing else.
    shipped = {os.path.basename(path)[:-3] for path in CODE_PATHS}
    assert shipped == {"classifier_network", "image_spec", "image_input", "image_preprocessing"}
    allowed = set(sys.stdlib_module_names) | {"mlflow", "numpy", "pandas", "torch", "PIL", "", "tasks"} | shipped
    for path in (CODE_PATH, *CODE_PATHS):
        imports = _imports(path)
        assert {name.split(".")[0] for name in imports} <= allowed, path
        assert {n for n in imports if n.startswith("tasks")} <= {f"tasks.domain.{m}" for m in shipped}, path
        assert {n for n in imports if n.startswith(".")} <= {f".{m}" for m in shipped}, path


def test_training_builds_the_network_without_importing_mlflow():
    code = (
        "import sys; from tasks.domain.network import build_model; build_model('resnet18-1ch-small'); "
        "print(sorted(m for m in ('mlflow', 'pandas', 'tasks.domain.classifier_model') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_model_file_network_and_normalisation_match_the_training_code():
    from tasks.domain.classifier_model import normalise
    from tasks.domain.classifier_network import build_network
    from tasks.domain.network import MEAN, STD, build_model, to_inputs

    torch.manual_seed(0)
    ours, theirs = build_network(), build_model()  # ours: torch only; theirs: torchvision's resnet18
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    theirs.train()
    for _ in range(2):  # move the batch-norm statistics off their initial values
        theirs(torch.randn(8, 1, 28, 28))
    ours.load_state_dict(theirs.state_dict())
    images = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
    assert torch.equal(normalise(images, MEAN, STD), to_inputs(images))
    with torch.no_grad():
        assert torch.allclose(ours.eval()(to_inputs(images)), theirs.eval()(to_inputs(images)), atol=1e-5)


def test_the_small_image_network_keeps_14x14_into_the_first_block_at_a_quarter_of_the_weights():
    from tasks.domain import classifier_network
    from tasks.domain.network import TUTORIAL_ARCHITECTURE, build_model
    from tasks.domain.recipe import get_recipe

    assert TUTORIAL_ARCHITECTURE == classifier_network.ARCHITECTURE  # the two names of the tutorial's network
    assert get_recipe("tutorial").architecture == "resnet18-1ch"
    assert get_recipe("augmented").architecture == "resnet18-1ch-small"
    small, tutorial = build_model("resnet18-1ch-small"), build_model("resnet18-1ch")
    assert isinstance(small, classifier_network.ResNet18)  # training builds the registered network's own class
    seen = {}
    for name, network in (("small", small), ("tutorial", tutorial)):
        network.layer1.register_forward_pre_hook(lambda _m, inputs, name=name: seen.update({name: inputs[0].shape}))
        assert network(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert seen == {"small": (2, 32, 14, 14), "tutorial": (2, 64, 7, 7)}
    count = lambda network: sum(p.numel() for p in network.parameters())  # noqa: E731
    assert 2.7e6 < count(small) < 2.9e6 and 11.1e6 < count(tutorial) < 11.3e6
    with pytest.raises(ValueError, match="'resnet18-1ch', 'resnet18-1ch-small'"):
        build_model("resnet50")


def test_registering_weights_of_another_architecture_fails_before_writing(tmp_path):
    from model_helpers import dataset_identity

    from tasks.domain.classifier_network import build_network
    from tasks.domain.model_card import ModelCard
    from tasks.domain.model_package import save_model

    card = ModelCard(dataset=dataset_identity(), architecture="resnet18-1ch")
    with pytest.raises(ValueError, match=r"ModelCard.architecture='resnet18-1ch'.*Pass ModelCard\(architecture"):
        save_model(build_network(architecture="resnet18-1ch-small"), card, str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()


def test_saving_skips_mlflows_check_of_requirements_pinned_from_this_environment(tmp_path, monkeypatch):
    from mlflow.utils import environment, requirements_utils
    from model_helpers import dataset_identity

    from tasks.domain.classifier_network import build_network
    from tasks.domain.model_card import ModelCard
    from tasks.domain.model_package import pip_requirements, save_model

    # The check maps every installed distribution to its modules (0.5-1.3 s); its pins are this process's versions.
    checked = []
    monkeypatch.setattr(requirements_utils, "_check_requirement_satisfied", checked.append)
    original = environment.warn_dependency_requirement_mismatches
    card = ModelCard(dataset=dataset_identity(), architecture="resnet18-1ch-small")
    path = save_model(build_network(architecture="resnet18-1ch-small"), card, str(tmp_path / "model"))
    assert checked == []
    assert environment.warn_dependency_requirement_mismatches is original  # MLflow's own check again after the save
    with open(os.path.join(path, "requirements.txt")) as f:
        assert set(pip_requirements()) <= set(f.read().split())
    environment.warn_dependency_requirement_mismatches(["torch==0.0.1"])  # outside the block: checked as before
    assert checked == ["torch==0.0.1"]


@pytest.mark.parametrize("form", ["uint8", "float", "784", "1x28x28", "list", "frame784", "frame_column"])
def test_every_input_form_becomes_the_same_pixels(form):
    from tasks.domain.classifier_model import as_image_batch

    images = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    data = {
        "uint8": images,
        "float": images.astype(np.float64),
        "784": images.reshape(4, 784),
        "1x28x28": images[:, None],
        "list": images.tolist(),
        "frame784": pd.DataFrame(images.reshape(4, 784)),
        "frame_column": pd.DataFrame({"image": list(images)}),
    }[form]
    assert np.array_equal(as_image_batch(data).numpy(), images[:, None].astype(np.float32))


def test_probabilities_and_labels_of_a_batch():
    from tasks.domain.classifier_model import predict_probabilities, predictions_frame

    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 3))
    probs = predict_probabilities(network, torch.rand(10, 28, 28) * 255, 0.3, 0.3, batch_size=3)
    frame = predictions_frame(probs, ("a", "b", "c"))
    assert probs.shape == (10, 3) and torch.allclose(probs.sum(1), torch.ones(10))
    assert frame["class"].tolist() == [("a", "b", "c")[i] for i in frame["label"]]


def test_forward_in_batches_shares_the_batches_among_threads_of_one_intra_op_thread_and_keeps_the_order():
    import threading

    from tasks.domain.classifier_network import build_network, forward_in_batches

    torch.manual_seed(0)
    network = build_network(10, "resnet18-1ch-small")
    images = torch.randint(0, 256, (777, 28, 28), dtype=torch.uint8)
    prepare = lambda batch: batch.unsqueeze(1).float() / 255  # noqa: E731
    seen: dict[int, int] = {}  # thread -> torch's thread count there, during a forward pass
    network.register_forward_hook(lambda *_: seen.update({threading.get_ident(): torch.get_num_threads()}))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread: every batch in this thread, one after the other
        alone = forward_in_batches(network, images, prepare, batch_size=50)
        assert list(seen) == [threading.get_ident()]
        seen.clear()
        torch.set_num_threads(3)  # 16 batches, taken in turn by 3 threads of one intra-op thread each
        shared = forward_in_batches(network, images, prepare, batch_size=50)
        assert torch.get_num_threads() == 3  # the caller's setting is its own
    finally:
        torch.set_num_threads(threads)
    # Each thread takes a batch when it is free, so on a loaded machine one may take none: at least two did.
    assert 2 <= len(seen) <= 3 and threading.get_ident() not in seen and set(seen.values()) == {1}
    assert shared.shape == (777, 10) and torch.equal(shared, alone)
    with torch.inference_mode():  # image by image, in order
        assert torch.allclose(
            shared[[0, 399, 776]],
            network(prepare(images[[0, 399, 776]]).contiguous(memory_format=torch.channels_last)),
            atol=1e-5,
        )

    def failing(batch):
        if len(batch) < 50:  # the last, shorter batch
            raise ValueError("this batch cannot be read")
        return prepare(batch)

    with pytest.raises(ValueError, match="this batch cannot be read"):
        forward_in_batches(network, images, failing, batch_size=50)


def test_many_images_are_scored_by_a_copy_with_the_batch_norms_folded_and_give_the_same_outputs(monkeypatch):
    from tasks.domain import classifier_network
    from tasks.domain.classifier_network import build_network, forward_in_batches, scoring_copy

    torch.manual_seed(0)
    network = build_network(10, "resnet18-1ch-small")
    for module in network.modules():  # trained-like statistics, so that folding changes every convolution
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    before = {name: value.clone() for name, value in network.state_dict().items()}
    images = torch.randint(0, 256, (300, 28, 28), dtype=torch.uint8)
    prepare = lambda batch: batch.unsqueeze(1).float() / 255  # noqa: E731
    norms_run = []  # BatchNorm modules that ran, in any thread
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, *_: norms_run.append(module) if isinstance(module, torch.nn.BatchNorm2d) else None
    )
    try:
        plain = forward_in_batches(network, images, prepare, batch_size=100)  # fewer than SCORING_COPY_FROM_IMAGES
        assert len(norms_run) == 3 * 20  # 3 batches through the network as it is
        norms_run.clear()
        monkeypatch.setattr(classifier_network, "SCORING_COPY_FROM_IMAGES", 300)
        folded = forward_in_batches(network, images, prepare, batch_size=100)
        assert norms_run == []  # no BatchNorm left to run
    finally:
        hook.remove()
    assert torch.allclose(folded, plain, atol=1e-5) and torch.equal(folded.argmax(1), plain.argmax(1))
    # The network itself is untouched: the same weights and statistics, to be saved, registered or trained.
    after = network.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)
    copy_state = scoring_copy(network).state_dict()
    assert not any(".bn" in name or name.startswith("bn") for name in copy_state)
    assert "conv1.bias" in copy_state and "layer2.0.downsample.0.bias" in copy_state


@pytest.mark.parametrize("height, width, stride", [(2, 2, 1), (2, 2, 2), (1, 1, 1), (2, 1, 1), (3, 3, 1)])
def test_a_convolution_on_a_map_smaller_than_its_kernel_runs_as_one_matrix_product(height, width, stride):
    import torch.nn.functional as F

    from tasks.domain.classifier_network import _SmallMapConv2d

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 6, 3, stride, 1, bias=True)
    small = _SmallMapConv2d.replacing(conv)
    assert isinstance(small, _SmallMapConv2d) and small.weight is conv.weight and small.bias is conv.bias
    x = torch.randn(5, 8, height, width).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        expected, out = F.conv2d(x, conv.weight, conv.bias, stride, 1), small(x)
    assert out.shape == expected.shape and torch.allclose(out, expected, atol=1e-5)
    # A map with as many pixels as the kernel has taps, or more, goes through the convolution itself.
    assert list(small._products) == ([] if height * width >= 9 else [(height, width)])
    # Convolutions it cannot stand for are kept as they are.
    for other in (torch.nn.Conv2d(8, 6, 1), torch.nn.Conv2d(8, 8, 3, groups=2), torch.nn.Conv2d(8, 6, 3, dilation=2)):
        assert _SmallMapConv2d.replacing(other) is other
    # A map too small for the kernel even padded gets the convolution's own error.
    unpadded = _SmallMapConv2d.replacing(torch.nn.Conv2d(8, 6, 3, stride, 0))
    with pytest.raises(RuntimeError, match="Kernel size can't be greater than actual input size"):
        unpadded(torch.randn(2, 8, 2, 2))


@pytest.mark.parametrize("architecture, products", [("resnet18-1ch-small", 3), ("resnet18-1ch", 7)])
def test_the_scoring_copy_runs_the_last_blocks_as_matrix_products_with_the_same_labels(architecture, products):
    from tasks.domain.classifier_network import _SmallMapConv2d, build_network, forward_in_batches, scoring_copy
    from tasks.domain.network import to_inputs

    torch.manual_seed(0)
    network = build_network(10, architecture)
    for module in network.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    images = torch.randint(0, 256, (64, 28, 28), dtype=torch.uint8)
    copy = scoring_copy(network)
    plain, scored = (forward_in_batches(net, images, to_inputs, batch_size=32) for net in (network, copy))
    assert torch.allclose(scored, plain, atol=1e-4) and torch.equal(scored.argmax(1), plain.argmax(1))
    # 28x28 images reach the default network's last block as 2x2 maps (3 convolutions of 3x3 on them), the
    # tutorial's third block as 2x2 and its last as 1x1 (7, the stride-2 one from 2x2 to 1x1 included).
    used = [name for name, module in copy.named_modules() if isinstance(module, _SmallMapConv2d) and module._products]
    assert len(used) == products, used


def write_idx(path, pixels):
    payload = struct.pack(">IIII", 0x803, len(pixels), 28, 28) + pixels.tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(payload) if str(path).endswith(".gz") else payload)


def decoded(images) -> np.ndarray:
    """The pixels of an ImageSet's files (gray), as the model decodes them."""
    from tasks.domain.image_preprocessing import decode_image

    return np.stack([decode_image(data, 1)[0].numpy() for data in images.files])


def test_reader_reads_idx_npy_and_png_folders(tmp_path):
    from tasks.domain.image_source import read_images, write_png_folder

    pixels = np.random.default_rng(1).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "a-images-idx3-ubyte.gz", pixels)
    write_idx(tmp_path / "a-images-idx3-ubyte", pixels)
    np.save(tmp_path / "a.npy", pixels.reshape(5, 784).astype(np.float32))
    write_png_folder(pixels, str(tmp_path / "pngs"))
    for name in ("a-images-idx3-ubyte.gz", "a-images-idx3-ubyte", "a.npy"):
        images = read_images(str(tmp_path / name))
        assert np.array_equal(images.pixels, pixels) and images.files is None, name
    pngs = read_images(str(tmp_path / "pngs"))
    assert pngs.pixels is None and np.array_equal(decoded(pngs), pixels)
    assert pngs.ids[-1] == "image_00004.png" and pngs.labels is None
    assert read_images(str(tmp_path / "a.npy")).chunk(1, 3).ids == ("1", "2")


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("t-images-idx3-ubyte.gz", b"\x1f\x8bnot gzip", "not a readable gzip file"),
        ("t-images-idx3-ubyte", struct.pack(">IIII", 0x803, 10, 28, 28) + b"\0" * 100, "truncated"),
        ("t-labels-idx1-ubyte", struct.pack(">II", 0x801, 3) + b"\0\0\0", "wrong magic number"),
        ("x.npy", b"nonsense", "not a readable .npy array"),
        ("x.txt", b"hello", "unknown file type"),
    ],
)
def test_reader_names_the_bad_file(tmp_path, name, content, words):
    from tasks.domain.image_source import ImageSourceError, read_images

    (tmp_path / name).write_bytes(content)
    with pytest.raises(ImageSourceError, match=words):
        read_images(str(tmp_path / name))


def test_reader_refuses_empty_inputs(tmp_path):
    from tasks.domain.image_source import ImageSourceError, read_images

    (tmp_path / "empty").mkdir()
    np.save(tmp_path / "none.npy", np.zeros((0, 28, 28), dtype=np.uint8))
    for name in ("empty", "none.npy"):
        with pytest.raises(ImageSourceError, match="holds no images"):
            read_images(str(tmp_path / name))
    with pytest.raises(ImageSourceError, match="does not exist"):
        read_images(str(tmp_path / "missing.npy"))


def test_predictions_are_written_atomically_and_read_back(tmp_path):
    from tasks.domain.batch_scoring import class_histogram
    from tasks.domain.predictions_file import output_format, read_predictions, write_predictions

    frame = pd.DataFrame(
        {
            "image_id": ["0", "1", "2"],
            "label": [1, 1, 9],
            "class": ["Trouser", "Trouser", "Ankle boot"],
            "probability": [0.9, 0.8, 0.7],
            "model_name": "m",
            "model_version": "3",
        }
    )
    for name in ("p.parquet", "p.csv"):
        url = write_predictions(frame, str(tmp_path / "out" / name))
        pd.testing.assert_frame_equal(read_predictions(url), frame)
    assert sorted(os.listdir(tmp_path / "out")) == ["p.csv", "p.parquet"]
    assert [(c.class_name, c.images) for c in class_histogram(frame)] == [("Trouser", 2), ("Ankle boot", 1)]
    with pytest.raises(ValueError, match=r"\.parquet or \.csv"):
        output_format("p.json")


def test_scoring_summary_of_a_run():
    import pickle

    from tasks.domain.batch_scoring import ClassCount, ScoringSummary
    from tasks.domain.scoring_model import ResolvedModel

    frame = pd.DataFrame(
        {
            "image_id": ["0", "1", "2"],
            "label": [9, 1, 9],
            "class": ["Ankle boot", "Trouser", "Ankle boot"],
            "probability": [0.9, 0.8, 0.7],
            "model_name": "m",
            "model_version": "3",
        }
    )
    model = ResolvedModel(name="m", alias="champion", version="3", tracking_uri="http://u:pw@mlflow:5000")
    summary = ScoringSummary.of(frame, model, "s3://b/p.parquet", chunks=2, score_seconds=1.5)
    assert (summary.output_url, summary.images, summary.chunks) == ("s3://b/p.parquet", 3, 2)
    assert summary.score_seconds == 1.5
    assert (summary.model_name, summary.model_version, summary.alias) == ("m", "3", "champion")
    assert summary.histogram == (ClassCount(9, "Ankle boot", 2, 2 / 3), ClassCount(1, "Trouser", 1, 1 / 3))
    # The flow's result is stored by Prefect: picklable, and it never carries the tracking URI's password.
    assert pickle.loads(pickle.dumps(summary)) == summary and "pw" not in repr(summary)
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.images = 4


def test_reader_and_writer_on_s3(tmp_path, monkeypatch):
    from moto.server import ThreadedMotoServer

    from tasks.domain.image_source import read_images, write_png_folder
    from tasks.domain.predictions_file import read_predictions, write_predictions

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir("scoring")
        pixels = np.random.default_rng(2).integers(0, 256, (3, 28, 28), dtype=np.uint8)
        write_idx(tmp_path / "x-images-idx3-ubyte.gz", pixels)
        fs.put_file(str(tmp_path / "x-images-idx3-ubyte.gz"), "scoring/x-images-idx3-ubyte.gz")
        write_png_folder(pixels, "s3://scoring/pngs", options)
        assert np.array_equal(read_images("s3://scoring/x-images-idx3-ubyte.gz", options).pixels, pixels)
        assert np.array_equal(decoded(read_images("s3://scoring/pngs", options)), pixels)
        frame = pd.DataFrame(
            {
                "image_id": ["0"],
                "label": [3],
                "class": ["Dress"],
                "probability": [0.5],
                "model_name": "m",
                "model_version": "1",
            }
        )
        write_predictions(frame, "s3://scoring/out/p.parquet", options)
        pd.testing.assert_frame_equal(read_predictions("s3://scoring/out/p.parquet", options), frame)
    finally:
        server.stop()


def test_recipes_and_augmentation():
    from tasks.domain.recipe import RECIPES, augment_batch, get_recipe, make_optimizer, make_scheduler

    assert get_recipe("tutorial").optimizer == "adam" and get_recipe("tutorial").lr == 1e-3
    assert get_recipe("augmented", lr=0.05).lr == 0.05
    with pytest.raises(ValueError, match="one of 'tutorial', 'augmented'"):
        get_recipe("fancy")
    recipe = RECIPES["augmented"]
    x = torch.randn(16, 1, 28, 28)
    y = augment_batch(x, recipe, background=-1.0)
    assert y.shape == x.shape and not torch.equal(x, y)
    assert torch.equal(augment_batch(x, RECIPES["tutorial"], background=-1.0), x)
    # A crop with 2-pixel padding keeps a 24x24 core of each image (possibly flipped, shifted by <= 2).
    one = torch.arange(784, dtype=torch.float32).view(1, 1, 28, 28)
    out = augment_batch(one.repeat(8, 1, 1, 1), recipe, background=-1.0)
    assert ((out == -1.0).sum(dim=(1, 2, 3)) <= 4 * 28).all()
    model = torch.nn.Linear(2, 2)
    optimizer = make_optimizer(recipe, model.parameters())
    scheduler = make_scheduler(recipe, optimizer, steps_per_epoch=10, epochs=2)
    rates = []
    for _ in range(20):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    assert max(rates) == pytest.approx(recipe.lr, rel=0.05) and rates[-1] < recipe.lr / 100
    assert make_scheduler(RECIPES["tutorial"], optimizer, 10, 2) is None


@pytest.mark.parametrize(
    "challenger, champion, margin, promote",
    [
        (0.90, 0.90, 0.0, False),  # a tie keeps the champion
        (0.903, 0.90, 0.005, False),  # a win below the margin keeps it
        (0.905, 0.90, 0.005, True),  # a win of exactly the margin takes it
        (0.91, 0.90, 0.005, True),
        (0.89, 0.90, 0.0, False),
    ],
)
def test_promotion_needs_a_win_by_the_margin(challenger, champion, margin, promote):
    from tasks.domain.promotion import decide_promotion

    decision = decide_promotion(challenger, champion, "4", min_margin=margin)
    assert decision.promote is promote
    tags = decision.tags()
    assert tags["promotion_min_margin"] == f"{margin:.6f}"
    assert tags["promotion_margin"] == f"{challenger - champion:.6f}"
    assert tags["previous_champion_test_accuracy"] == f"{champion:.6f}"


def test_unscorable_champion_is_kept_with_the_reason():
    from tasks.domain.promotion import decide_promotion

    decision = decide_promotion(0.5, None, "2", champion_error="AssertionError: Guard failed")
    assert not decision.promote and "could not be scored (AssertionError: Guard failed)" in decision.reason
    with pytest.raises(ValueError, match="min_margin"):
        decide_promotion(0.5, 0.4, "2", min_margin=-0.1)


def test_requirement_mismatches_name_the_package_and_the_installed_version(tmp_path):
    from importlib.metadata import version

    from tasks.domain.scoring_model import ResolvedModel, requirement_mismatches

    installed = version("torch")
    (tmp_path / "requirements.txt").write_text(
        f"# pinned at registration\ntorch=={installed}\nnumpy==0.0.1\nno-such-package-xyz==1.0\n-e .\n"
    )
    model = ResolvedModel(
        name="m", alias="champion", version="1", tracking_uri=f"sqlite:///{tmp_path}/db", source=str(tmp_path)
    )
    assert model.load_uri == str(tmp_path)
    problems = requirement_mismatches(model)
    assert problems == [f"numpy==0.0.1 (installed: {version('numpy')})", "no-such-package-xyz==1.0 (not installed)"]
    assert ResolvedModel(name="m", alias="a", version="2", tracking_uri="x").load_uri == "models:/m/2"


def test_a_ray_task_gets_as_many_torch_threads_as_the_cpus_it_reserved(ray_session):
    import ray

    from tasks.domain.cpu_threads import use_assigned_cpus

    @ray.remote
    def threads_after() -> tuple[int, int]:
        torch.set_num_threads(2)  # as a worker that preloaded torch has it: one thread per core
        return use_assigned_cpus(), torch.get_num_threads()

    @ray.remote(num_cpus=1)
    def refaulted_after() -> int:
        use_assigned_cpus()
        sys.path.insert(0, TESTS_DIR)  # a plain Ray task: the worker has not the test's path
        from malloc_probe import refaulted_pages

        return refaulted_pages()

    assert ray.get(threads_after.options(num_cpus=1).remote()) == (1, 1)
    assert ray.get(threads_after.options(num_cpus=2).remote()) == (2, 2)
    # trainlib's malloc settings (allocator.py): the second round faults nothing in (glibc's defaults: ~6,000).
    assert ray.get(refaulted_after.remote()) < PAGES / 10
    before = torch.get_num_threads()
    assert use_assigned_cpus() == before  # the driver runs no task: its threads are left alone
