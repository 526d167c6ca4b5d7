"""Turn the FashionMNIST idx files into an image-folder source: one PNG per image, one folder per class.

Runs as a script (or :func:`write_folder` from Python). The layout is the pipeline's folder source
(docs/data.md): ``OUT/{train,test}/<class>/<n>.png``, or with ``--batches N`` the images dealt out
to ``OUT/batch-000/{train,test}/<class>/<n>.png`` ... in order, as N arrivals. Class folder names are
FashionMNIST's class names with ``/`` replaced by ``-`` (``T-shirt-top``). ``--skip`` starts after the
images an earlier call wrote, so a later arrival holds new images (``OUT`` = ``SOURCE/batch-001``).

Example::

    python examples/fashion_mnist_to_folder.py ~/data/fashion-mnist /tmp/fashion-folder --limit 600
    python -m flows.main --data /tmp/fashion-folder
    python examples/fashion_mnist_to_folder.py ~/data/fashion-mnist /tmp/fashion-folder/batch-001 --limit 100 --skip 600
"""

from __future__ import annotations

import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, REPO_ROOT)

from tasks.domain.dataset_registry import get_dataset_spec  # noqa: E402
from tasks.domain.idx_files import load_fashion_mnist_split  # noqa: E402


def class_folder(name: str) -> str:
    """A class name as a folder name (``T-shirt/top`` -> ``T-shirt-top``)."""
    return name.replace("/", "-")


def write_folder(
    idx_folder: str,
    out: str,
    limit: int | None = None,
    test_limit: int | None = None,
    batches: int = 0,
    dataset: str = "fashion-mnist",
    skip: int = 0,
    test_skip: int | None = None,
) -> int:
    """Write the PNGs of ``idx_folder``'s data set under ``out``; returns the number of images written.

    ``limit``/``test_limit``: the first N training/test images only (``test_limit`` defaults to ``limit // 5``).
    ``batches``: deal the images out to that many arrival folders (0: none).
    ``skip``/``test_skip``: start after the first N training/test images (``test_skip`` defaults to ``skip // 5``),
    e.g. those an earlier call wrote; file names keep the images' indices.
    """
    from PIL import Image

    names = [class_folder(n) for n in get_dataset_spec(dataset).class_names]
    if test_limit is None and limit is not None:
        test_limit = max(1, limit // 5)
    if test_skip is None:
        test_skip = skip // 5
    written = 0
    for split, cut, first in (("train", limit, skip), ("test", test_limit, test_skip)):
        images, labels = load_fashion_mnist_split(
            idx_folder, train=split == "train", limit=None if cut is None else first + cut
        )
        images, labels = images[first:], labels[first:]
        per_batch = -(-len(labels) // batches) if batches else len(labels)
        made: set[str] = set()
        for n, (image, label) in enumerate(zip(images.numpy(), labels.tolist(), strict=True)):
            i = first + n
            prefix = [f"batch-{n // per_batch:03d}"] if batches else []
            folder = os.path.join(out, *prefix, split, names[label])
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            Image.fromarray(image, mode="L").save(os.path.join(folder, f"{split}-{i:05d}.png"))
            written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("idx_folder", help="folder with the four (Fashion-)MNIST idx files (.gz or not)")
    parser.add_argument("out", help="the folder source to write")
    parser.add_argument("--limit", type=int, default=None, help="the first N training images only")
    parser.add_argument("--test-limit", type=int, default=None, help="the first N test images only (default limit/5)")
    parser.add_argument("--batches", type=int, default=0, help="deal the images out to N arrival folders")
    parser.add_argument("--dataset", default="fashion-mnist", help="fashion-mnist or mnist (class names)")
    parser.add_argument("--skip", type=int, default=0, help="start after the first N training images")
    parser.add_argument("--test-skip", type=int, default=None, help="start after the first N test images (skip/5)")
    args = parser.parse_args(argv)
    count = write_folder(
        args.idx_folder, args.out, args.limit, args.test_limit, args.batches, args.dataset, args.skip, args.test_skip
    )
    print(f"Wrote {count} PNG(s) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
