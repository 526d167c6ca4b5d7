"""Recipe comparison on a subset of the real FashionMNIST: the tutorial's Adam vs the augmented default.

    python bench/bench_recipe.py [--train-images 6000] [--epochs 2] [--threads 2]

One process, no Ray, no pipeline: the training loop's own pieces (network, recipe, augmentation)
on the first N training images for a few epochs each, then test accuracy on all 10,000 test
images. It is a quick, honest signal on a shared 2-core machine, NOT the 10-epoch full-data
figure; that one is `python bench/bench_pipeline.py --epochs 10 --recipe augmented` (and
`--recipe tutorial`). Writes bench/results/recipe.json and recipe.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def train_and_test(
    recipe_name: str, images, labels, test_images, test_labels, epochs: int, batch_size: int, seed: int
) -> dict:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.evaluation import evaluate_model
    from tasks.domain.network import MEAN, STD, build_model, to_inputs
    from tasks.domain.recipe import augment_batch, get_recipe, make_optimizer, make_scheduler

    torch.manual_seed(seed)
    recipe = get_recipe(recipe_name)
    model = build_model(recipe.architecture)
    loader = DataLoader(TensorDataset(to_inputs(images), labels), batch_size=batch_size, shuffle=True)
    optimizer = make_optimizer(recipe, model.parameters())
    scheduler = make_scheduler(recipe, optimizer, len(loader), epochs)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    started = time.perf_counter()
    per_epoch = []
    for _epoch in range(epochs):
        model.train()
        for x, y in loader:
            loss = criterion(model(augment_batch(x, recipe, -MEAN / STD)), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        per_epoch.append(time.perf_counter() - started)
    train_s = time.perf_counter() - started
    report = evaluate_model(model, test_images, test_labels, get_dataset_spec("fashion-mnist").class_names)
    return {
        "recipe": recipe.record(),
        "test_accuracy": report.accuracy,
        "test_loss": report.loss,
        "train_seconds": train_s,
        "epoch_end_seconds": per_epoch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--train-images", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", action="append", default=None, help="default: tutorial and augmented")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()

    import torch

    from tasks.domain.idx_files import load_fashion_mnist_split

    torch.set_num_threads(args.threads)
    images, labels = load_fashion_mnist_split(args.mirror, train=True, limit=args.train_images)
    test_images, test_labels = load_fashion_mnist_split(args.mirror, train=False)
    load_before = os.getloadavg()
    runs = []
    for name in args.recipe or ["tutorial", "augmented"]:
        runs.append(
            train_and_test(name, images, labels, test_images, test_labels, args.epochs, args.batch_size, args.seed)
        )
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "setup": {
            "train_images": len(labels),
            "test_images": len(test_labels),
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "seed": args.seed,
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
        "runs": runs,
    }
    lines = [
        f"Subset comparison: first {len(labels)} training images, {args.epochs} epoch(s), batch {args.batch_size}, "
        f"{args.threads} threads, one process; test accuracy on all {len(test_labels)} test images. "
        f"Load average before/after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} (shared machine).",
        "",
        "| recipe | test accuracy | test loss | training (s) |",
        "|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['recipe']['name']} | {100 * r['test_accuracy']:.2f}% | {r['test_loss']:.4f} | "
            f"{r['train_seconds']:.0f} |"
        )
    write_results(args.out, "recipe", result, lines)


if __name__ == "__main__":
    main()
