"""Ray Train's Lightning and Transformers getting-started examples on trainlib and on Ray Train, side by side.

    python bench/bench_frameworks.py                         # both examples, both frameworks, 1 repeat
    python bench/bench_frameworks.py --images 512 --epochs 2 --repeats 2

Each run is a fresh ``python script.py`` process (its own Ray) of the example in ``examples/`` as trainlib runs it,
or converted back to Ray Train (``trainlib`` replaced by ``ray.train``, the only difference), on 2 CPU workers:

* lightning: examples/lightning_fashion_mnist.py (ResNet18, batches of 128) on the first ``--images`` of the
  official FashionMNIST (``--data``), ``max_epochs`` set to ``--epochs``;
* transformers: examples/transformers_text_classifier.py (a 2-layer BERT from a config, 64 generated examples,
  3 epochs, batches of 8).

Measured: the process's wall time (start to exit), ``fit()``'s wall time, and steps/s = optimizer steps per worker
(the examples' last reported ``step``) / ``fit()``'s wall. Runs alternate between the frameworks. Writes
``<results-dir>/frameworks.json`` and ``frameworks.md``, with the load average around the runs (the machine is
shared: compare the frameworks within one set, not across sets).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
EXAMPLES = {
    "lightning": os.path.join(REPO, "examples", "lightning_fashion_mnist.py"),
    "transformers": os.path.join(REPO, "examples", "transformers_text_classifier.py"),
}
FIT_CALLS = ("result: trainlib.Result = trainer.fit()", "result: trainlib.Result = ray_trainer.fit()")
PREFIX = "import time as _bench_time\n"
# After the example's last line: what the bench reads back, one JSON line.
SUFFIX = """
import json as _bench_json
print("BENCH_RESULT " + _bench_json.dumps({"fit_s": _bench_fit_s, "step": int(result.metrics["step"]),
      "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}}))
"""


def script_text(example: str, framework: str, epochs: int, images: int) -> str:
    """The example as ``framework`` runs it, with fit() timed (and, for lightning, the epochs and images set)."""
    with open(EXAMPLES[example]) as f:
        text = f.read()
    call = next(c for c in FIT_CALLS if c in text)
    name = call.split("=")[1].strip()
    text = text.replace(
        call,
        f"_bench_t0 = _bench_time.time()\n{call.split('=')[0]}= {name}\n_bench_fit_s = _bench_time.time() - _bench_t0",
    )
    if example == "lightning":
        assert "max_epochs=10," in text
        text = text.replace("max_epochs=10,", f"max_epochs={epochs},")
        subset = f"train_data = torch.utils.data.Subset(train_data, range({images}))\n    train_dataloader ="
        text = text.replace("train_dataloader =", subset, 1)
    if framework == "ray":
        text = text.replace("trainlib", "ray.train")
    return PREFIX + text + SUFFIX


def run_once(example: str, framework: str, args: argparse.Namespace) -> dict:
    from tasks.domain.torchvision_layout import torchvision_layout

    with tempfile.TemporaryDirectory(prefix="bench_frameworks_") as folder:
        tmpdir = os.path.join(folder, "tmp")
        os.makedirs(tmpdir)
        if example == "lightning":
            torchvision_layout(args.data, os.path.join(tmpdir, "data"))
        script = os.path.join(folder, "script.py")
        with open(script, "w") as f:
            f.write(script_text(example, framework, args.epochs, args.images))
        env = {**os.environ, "TMPDIR": tmpdir, "RAY_TMPDIR": "/tmp", "HOME": folder, "PYTHONPATH": REPO}
        env.pop("RAY_ADDRESS", None)
        if framework == "ray":  # Ray's own ray.init() would join any cluster this machine last started
            env["RAY_ADDRESS"] = "local"
        started = time.time()
        proc = subprocess.run([sys.executable, script], cwd=folder, env=env, capture_output=True, text=True)
        wall = time.time() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{example} on {framework} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    found = json.loads(lines[-1].split(" ", 1)[1])
    return {"wall_s": wall, **found, "steps_per_s": found["step"] / found["fit_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="lightning,transformers")
    parser.add_argument("--frameworks", default="trainlib,ray")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2, help="lightning: max_epochs (the example's is 10)")
    parser.add_argument("--images", type=int, default=1024, help="lightning: the first N FashionMNIST images")
    parser.add_argument("--data", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args(argv)
    examples, frameworks = args.examples.split(","), args.frameworks.split(",")
    load_before = os.getloadavg()
    runs = []
    for repeat in range(args.repeats):
        for example in examples:
            order = frameworks if repeat % 2 == 0 else frameworks[::-1]
            for framework in order:
                run = run_once(example, framework, args)
                runs.append({"example": example, "framework": framework, "repeat": repeat, **run})
                print(
                    f"{example:12s} {framework:8s} wall {run['wall_s']:.1f} s, fit {run['fit_s']:.1f} s, "
                    f"{run['step']} steps, {run['steps_per_s']:.2f} steps/s",
                    flush=True,
                )
    load_after = os.getloadavg()
    rows = []
    for example in examples:
        for framework in frameworks:
            mine = [r for r in runs if r["example"] == example and r["framework"] == framework]
            rows.append(
                {
                    "example": example,
                    "framework": framework,
                    "wall_s": statistics.median(r["wall_s"] for r in mine),
                    "fit_s": statistics.median(r["fit_s"] for r in mine),
                    "steps": mine[0]["step"],
                    "steps_per_s": statistics.median(r["steps_per_s"] for r in mine),
                }
            )
    lines = [
        "# Ray Train's Lightning and Transformers examples: trainlib and Ray Train",
        "",
        f"`python bench/bench_frameworks.py --epochs {args.epochs} --images {args.images} --repeats {args.repeats}`, "
        f"2 CPU workers, {os.cpu_count()} cores; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (a shared machine: compare within this table only). Medians of "
        f"{args.repeats} run(s). steps/s: optimizer steps per worker / `fit()`'s wall, start-up (workers, process "
        "group, imports) included: with this few steps it measures the whole `fit()`, not a steady training rate.",
        "",
        "| example | framework | wall (s) | fit() (s) | steps per worker | steps/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['example']} | {r['framework']} | {r['wall_s']:.1f} | {r['fit_s']:.1f} | {r['steps']} | "
        f"{r['steps_per_s']:.2f} |"
        for r in rows
    ]
    write_results(
        args.results_dir,
        "frameworks",
        {"args": vars(args), "runs": runs, "rows": rows, "load_before": load_before, "load_after": load_after},
        lines,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
