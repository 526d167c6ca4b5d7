"""The GPU path in one call: the GPU tests, then local mode against plain PyTorch on the tutorial's network.

    python -m bench gpu                         # on a CUDA machine: tests/gpu, the benchmark, bench/results/gpu.md
    python bench/gpu_check.py --device cpu --steps 8 --repeats 1   # a quick sanity run of the benchmark on a CPU

Runs on the machine that calls it (docs/gpu.md). First it says what the machine has (torch, CUDA, the device,
and whether Ray, Prefect and MLflow are there: ``import trainlib`` needs Ray, nothing here needs Prefect or
MLflow) and runs ``pytest tests/gpu`` (with ``--device cuda`` only). Then the benchmark: the tutorial's network
(ResNet18 with a one-channel 7x7 ``conv1``, ``tasks/domain/classifier_network.py``'s ``resnet18-1ch``), Adam 1e-3,
batches of 128 generated 28x28 images from a DataLoader, trained ``--steps`` steps

- ``trainlib``: inside ``TorchTrainer(..., ScalingConfig(num_workers=0, use_gpu=True))`` (local mode: the
  function runs in that process), with ``prepare_model`` and ``prepare_data_loader(auto_transfer=True)`` and a
  ``trainlib.report`` every ``--report-every`` steps;
- ``plain``: the same loop in plain PyTorch (``model.to(device)``, ``batch.to(device, non_blocking=True)``).

Each run is a fresh process; the two variants alternate, ``--repeats`` times; steady steps/s leave out the first
``--warmup-steps`` (the clock is read after ``torch.cuda.synchronize()``). Target: trainlib >= 0.97x plain's
steps/s. Only a CUDA run writes ``bench/results/gpu.{json,md}``; a ``--device cpu`` run prints its figures and
writes nothing there (a CPU's figures are not a GPU's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from results_files import write_results  # noqa: E402

VARIANTS = ("trainlib", "plain")
TARGET_RATIO = 0.97  # trainlib's steady steps/s over plain PyTorch's, at least


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a sanity run of the benchmark")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="steps left out of the steady rate (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant, alternated (default 3)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--report-every", type=int, default=50, help="trainlib.report every N steps (default 50)")
    parser.add_argument("--skip-tests", action="store_true", help="run the benchmark only")
    parser.add_argument("--results-dir", default=RESULTS, help="where gpu.json and gpu.md go (CUDA runs only)")
    parser.add_argument("--run-one", choices=VARIANTS, help=argparse.SUPPRESS)  # one run, in a child process
    args = parser.parse_args(argv)
    if args.warmup_steps >= args.steps:
        parser.error(f"--warmup-steps {args.warmup_steps} must be below --steps {args.steps}")
    if args.report_every < 1 or args.repeats < 1 or args.batch_size < 1:
        parser.error("--report-every, --repeats and --batch-size must be at least 1")
    return args


# ----------------------------------------------------------------------------------------------- one run (child)


def _loader(steps: int, batch_size: int, pin: bool):
    import torch

    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch_size * 8, 1, 28, 28, generator=g)  # 8 distinct batches, cycled through
    labels = torch.randint(0, 10, (batch_size * 8,), generator=g)
    dataset = torch.utils.data.TensorDataset(images, labels)
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=steps * batch_size, generator=g)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin)


def _train(model, loader, device, steps: int, warmup: int, to_device, after_step) -> dict:
    """The loop both variants run; returns the steady steps/s and the time to the first step's end."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    first_step_s = steady_from = None
    step = 0
    for images, labels in loader:
        images, labels = to_device(images), to_device(labels)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        after_step(step, loss)
        if step == 1:
            sync()
            first_step_s = time.perf_counter() - start
        if step == warmup:
            sync()
            steady_from = time.perf_counter()
    sync()
    steady_s = time.perf_counter() - steady_from
    return {"steps": step, "steady_steps_per_s": (step - warmup) / steady_s, "first_step_s": first_step_s}


def run_one(args: argparse.Namespace) -> dict:
    import torch

    from tasks.domain.classifier_network import build_network

    torch.manual_seed(0)
    use_gpu = args.device == "cuda"
    if args.run_one == "plain":
        device = torch.device(args.device)
        model = build_network(10, "resnet18-1ch").to(device)
        loader = _loader(args.steps, args.batch_size, pin=use_gpu)
        return _train(
            model,
            loader,
            device,
            args.steps,
            args.warmup_steps,
            lambda t: t.to(device, non_blocking=True),
            lambda step, loss: None,
        )

    import trainlib
    import trainlib.torch

    def train_func():
        device = trainlib.torch.get_device()
        model = trainlib.torch.prepare_model(build_network(10, "resnet18-1ch"))
        loader = trainlib.torch.prepare_data_loader(
            _loader(args.steps, args.batch_size, pin=use_gpu), auto_transfer=True
        )

        def after_step(step: int, loss) -> None:
            if step % args.report_every == 0:
                trainlib.report({"loss": loss.item(), "step": step})

        return _train(model, loader, device, args.steps, args.warmup_steps, lambda t: t, after_step)

    with tempfile.TemporaryDirectory() as storage:
        result = trainlib.torch.TorchTrainer(
            train_func,
            scaling_config=trainlib.ScalingConfig(num_workers=0, use_gpu=use_gpu),
            run_config=trainlib.RunConfig(name="gpu-bench", storage_path=storage, verbose=False),
        ).fit()
    if result.error is not None:
        raise result.error
    return result.return_value


# ------------------------------------------------------------------------------------------------ the driver


def machine(device: str) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0)
        if device == "cuda" and torch.cuda.is_available()
        else platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }
    for name in ("ray", "prefect", "mlflow", "pytest", "torchvision"):
        info[f"has_{name}"] = importlib.util.find_spec(name) is not None
    return info


def run_tests() -> dict:
    """``pytest tests/gpu`` in a child process: its exit status and the summary line."""
    if importlib.util.find_spec("pytest") is None:
        print("pytest is not installed here: the GPU tests cannot run (docs/gpu.md)")
        return {"exit_status": None, "summary": "pytest missing"}
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-v", "-rs", "-p", "no:cacheprovider"]
    print("$", " ".join(command), flush=True)
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    print(out.stdout[-8000:], out.stderr[-2000:], sep="\n", flush=True)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return {"exit_status": out.returncode, "summary": lines[-1].strip("= ") if lines else ""}


def run_benchmark(args: argparse.Namespace) -> dict:
    runs: list[dict] = []
    base = [
        sys.executable,
        os.path.abspath(__file__),
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup_steps),
        "--batch-size",
        str(args.batch_size),
        "--report-every",
        str(args.report_every),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    for repeat in range(args.repeats):
        order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            started = time.perf_counter()
            out = subprocess.run([*base, "--run-one", variant], capture_output=True, text=True, env=env, cwd=REPO)
            wall = time.perf_counter() - started
            if out.returncode != 0:
                raise SystemExit(f"the {variant} run failed:\n{out.stderr[-4000:]}")
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run.update(variant=variant, repeat=repeat, wall_s=wall)
            print(
                f"{variant:9s} run {repeat + 1}: {run['steady_steps_per_s']:.2f} steps/s, wall {wall:.1f} s", flush=True
            )
            runs.append(run)
    medians = {v: statistics.median(r["steady_steps_per_s"] for r in runs if r["variant"] == v) for v in VARIANTS}
    return {"runs": runs, "median_steps_per_s": medians, "ratio": medians["trainlib"] / medians["plain"]}


def table(info: dict, tests: dict | None, bench: dict, args: argparse.Namespace) -> list[str]:
    ratio = bench["ratio"]
    lines = [
        "# The GPU path: tests/gpu and local mode against plain PyTorch",
        "",
        f"Reproduce: `python -m bench gpu` (= `python bench/gpu_check.py`). {info['device']}, torch {info['torch']} "
        f"(CUDA {info['cuda']}), Python {info['python']}, {info['cpus']} CPUs; Ray installed: "
        f"{info['has_ray']}.",
        "",
    ]
    if tests is not None:
        lines += [f"`pytest tests/gpu`: exit status {tests['exit_status']}, {tests['summary']}.", ""]
    lines += [
        f"The tutorial's network (`resnet18-1ch`), Adam 1e-3, batches of {args.batch_size} generated images, "
        f"{args.steps} steps, steady rate without the first {args.warmup_steps}; trainlib reports every "
        f"{args.report_every} steps; {args.repeats} fresh-process runs each, alternated, medians.",
        "",
        "| variant | steady steps/s (median) | each run | first step s |",
        "|---|---:|---|---:|",
    ]
    for v in VARIANTS:
        mine = [r for r in bench["runs"] if r["variant"] == v]
        each = ", ".join(f"{r['steady_steps_per_s']:.2f}" for r in mine)
        first = statistics.median(r["first_step_s"] for r in mine)
        lines.append(f"| {v} | {bench['median_steps_per_s'][v]:.2f} | {each} | {first:.2f} |")
    verdict = "met" if ratio >= TARGET_RATIO else "missed"
    lines += ["", f"trainlib local mode / plain PyTorch: **{ratio:.3f}x** (target >= {TARGET_RATIO}x: {verdict})."]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one:
        print(json.dumps(run_one(args)))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run this on a GPU machine, or pass --device cpu for a sanity run", file=sys.stderr)
        return 2
    info = machine(args.device)
    print(json.dumps(info, indent=1), flush=True)
    tests = None if args.skip_tests or args.device != "cuda" else run_tests()
    if not info["has_ray"]:
        print(
            "Ray is not installed: `import trainlib` needs it, so trainlib's GPU tests skipped and the benchmark "
            "cannot run its trainlib variant here; nothing written (docs/gpu.md: bringing Ray to the machine)",
            file=sys.stderr,
        )
        return 1
    bench = run_benchmark(args)
    lines = table(info, tests, bench, args)
    if args.device == "cuda":
        write_results(
            args.results_dir, "gpu", {"machine": info, "tests": tests, "settings": vars(args), **bench}, lines
        )
    else:
        print("\n".join(lines))
        print("\n(a CPU sanity run: nothing written to bench/results)")
    failed_tests = tests is not None and tests["exit_status"] not in (0, None)
    return 1 if failed_tests else 0


if __name__ == "__main__":
    sys.exit(main())
