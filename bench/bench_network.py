"""What each network costs on this CPU: a training step, scoring the 10,000 test images, a 64-image call.

    python bench/bench_network.py [--repeats 5]

One process, no Ray: the architectures of ``classifier_model.ARCHITECTURES`` (the tutorial's
``resnet18-1ch`` and the default recipe's ``resnet18-1ch-small``), random weights, generated
images. A training step is one worker's share of the pipeline's step (batch 128, one thread, SGD
with the augmented recipe's settings: forward, backward, update); scoring runs the registered
model's own path (``predict_probabilities``: batches of 256, channels-last) on two threads, as the
evaluate step does (through the network's ``scoring_copy``); the 10,000 images also, in rotating rounds, through
a copy with the BatchNorms folded but every convolution kept (the copy before its small-map products) and
through the network as it is. Medians of ``--repeats`` after one warm-up. Writes bench/results/network.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def measure(architecture: str, repeats: int) -> dict:
    import torch

    from tasks.domain import classifier_network
    from tasks.domain.classifier_model import predict_probabilities
    from tasks.domain.classifier_network import SCORING_COPY_FROM_IMAGES, _SmallMapConv2d, build_network
    from tasks.domain.network import MEAN, STD, build_model
    from tasks.domain.recipe import get_recipe, make_optimizer

    torch.manual_seed(0)
    model = build_model(architecture)  # what training builds
    optimizer = make_optimizer(get_recipe("augmented"), model.parameters())
    x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
    torch.set_num_threads(1)
    steps = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i:
            steps.append(time.perf_counter() - started)

    torch.set_num_threads(2)
    network = build_network(architecture=architecture).eval()  # what the registered model loads
    images = torch.randint(0, 256, (10_000, 28, 28), dtype=torch.uint8)
    predict_probabilities(network, images[:256], MEAN, STD)
    # The 10,000 images as scored (classifier_network.scoring_copy) and, in rotating rounds, through a copy that
    # only folds the BatchNorms (small-map products off) and through the network as it is: each step's gain.
    variants = ("scoring copy", "folded only", "as it is")
    scoring: dict[str, list[float]] = {variant: [] for variant in variants}
    replacing = _SmallMapConv2d.replacing
    for round_ in range(len(variants) * max(2, repeats // 2)):
        variant = variants[round_ % len(variants)]
        classifier_network.SCORING_COPY_FROM_IMAGES = (
            len(images) + 1 if variant == "as it is" else SCORING_COPY_FROM_IMAGES
        )
        _SmallMapConv2d.replacing = (lambda conv: conv) if variant == "folded only" else replacing
        started = time.perf_counter()
        predict_probabilities(network, images, MEAN, STD)
        scoring[variant].append(time.perf_counter() - started)
    classifier_network.SCORING_COPY_FROM_IMAGES = SCORING_COPY_FROM_IMAGES
    _SmallMapConv2d.replacing = replacing
    calls = []
    for _ in range(repeats * 4):
        started = time.perf_counter()
        predict_probabilities(network, images[:64], MEAN, STD)
        calls.append(time.perf_counter() - started)
    return {
        "architecture": architecture,
        "parameters": sum(p.numel() for p in network.parameters()),
        "train_step_s": statistics.median(steps),
        "score_10k_s": statistics.median(scoring["scoring copy"]),
        "score_10k_folded_only_s": statistics.median(scoring["folded only"]),
        "score_10k_unfolded_s": statistics.median(scoring["as it is"]),
        "call_64_p50_ms": 1000 * statistics.median(calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()

    import torch

    from tasks.domain.classifier_network import ARCHITECTURES

    load_before = os.getloadavg()
    runs = [measure(name, args.repeats) for name in ARCHITECTURES]
    result = {
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
        "repeats": args.repeats,
        "runs": runs,
    }
    lines = [
        "| architecture | weights | training step (batch 128, 1 thread) | 10,000 test images (2 threads) | "
        "same, BatchNorms folded, no small-map products | same, network as it is | "
        "64-image call p50 (2 threads) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| `{r['architecture']}` | {r['parameters'] / 1e6:.1f}M | {r['train_step_s']:.3f} s | "
        f"{r['score_10k_s']:.2f} s | {r['score_10k_folded_only_s']:.2f} s | {r['score_10k_unfolded_s']:.2f} s | "
        f"{r['call_64_p50_ms']:.0f} ms |"
        for r in runs
    ]
    lines += [
        "",
        f"Load average before/after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f}; "
        f"{os.cpu_count()} cores; medians of {args.repeats}.",
    ]
    write_results(args.out, "network", result, lines)


if __name__ == "__main__":
    main()
