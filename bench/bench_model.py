"""Benchmark of the registered model as users run it: in-process pyfunc, batch scoring on Ray, served latency.

    python bench/bench_model.py [--mirror ../shared/datasets/fashion-mnist] [--requests 100]

Registers a ResNet18 (random weights: speed does not depend on them) in a temporary MLflow
SQLite store, then measures on the 10,000 real test images:

* in-process ``mlflow.pyfunc.load_model(...).predict`` images/s (whole set, and 64-image calls);
* the ``score-images`` flow (local Prefect server, RayTaskRunner) with 1 and 2 Ray workers:
  images/s of the scoring stage (chunks of 2,500; the model loaded once per worker) and of the
  whole flow run;
* ``mlflow models serve --env-manager local``: p50/p99 latency of a 64-image POST /invocations.

The machine is shared: the load average before and after is written with the figures.
Writes bench/results/model.json and model.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
BIN = os.path.dirname(sys.executable)
MODEL_NAME = "bench-model"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def register(tracking_uri: str, mirror: str) -> str:
    from mlflow import MlflowClient

    from tasks.domain.classifier_network import build_network
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.model_card import DatasetIdentity, ModelCard
    from tasks.domain.model_package import log_and_register
    from tasks.domain.recipe import DEFAULT_RECIPE, get_recipe

    architecture = get_recipe(DEFAULT_RECIPE).architecture  # the network the pipeline registers
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.create_run(client.create_experiment("bench-model"), run_name="bench")
    card = ModelCard(
        dataset=DatasetIdentity("fashion-mnist", get_dataset_spec("fashion-mnist").md5s, mirror),
        recipe={"name": "random-weights"},
        architecture=architecture,
    )
    version = log_and_register(
        build_network(architecture=architecture), card, MODEL_NAME, run.info.run_id, tracking_uri
    )
    client.set_terminated(run.info.run_id)
    client.set_registered_model_alias(MODEL_NAME, "champion", version.version)
    return version.version


def bench_pyfunc(tracking_uri: str, images) -> dict:
    import mlflow

    from trainlib.mlflow import using_tracking_uri

    with using_tracking_uri(tracking_uri):
        started = time.perf_counter()
        model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")
        load_s = time.perf_counter() - started
    model.predict(images[:256])  # warm-up
    started = time.perf_counter()
    model.predict(images)
    whole_s = time.perf_counter() - started
    calls = []
    for start in range(0, 64 * 30, 64):
        t = time.perf_counter()
        model.predict(images[start : start + 64])
        calls.append(time.perf_counter() - t)
    return {
        "load_s": load_s,
        "images": len(images),
        "images_per_s": len(images) / whole_s,
        "call_64_p50_ms": 1000 * statistics.median(calls),
        "torch_threads": __import__("torch").get_num_threads(),
    }


def bench_scoring(tracking_uri: str, input_url: str, out_dir: str, workers: int) -> dict:
    from flows.score import ScoreParams, score_images

    started = time.perf_counter()
    summary = score_images(
        ScoreParams(
            input_url=input_url,
            output_url=os.path.join(out_dir, f"p{workers}.parquet"),
            model_name=MODEL_NAME,
            mlflow_tracking_uri=tracking_uri,
            chunk_size=2500,
            num_workers=workers,
        )
    )
    wall = time.perf_counter() - started
    return {
        "workers": workers,
        "images": summary.images,
        "chunks": summary.chunks,
        "score_seconds": summary.score_seconds,
        "images_per_s": summary.images / summary.score_seconds,
        "flow_wall_s": wall,
        "flow_images_per_s": summary.images / wall,
    }


def bench_serving(tracking_uri: str, images, requests: int, log_path: str) -> dict:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=tracking_uri, PATH=f"{BIN}:{env.get('PATH', '')}")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                f"{BIN}/mlflow",
                "models",
                "serve",
                "-m",
                f"models:/{MODEL_NAME}@champion",
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.perf_counter() - started > 300:
                    raise RuntimeError(f"mlflow models serve did not start; see {log_path}") from None
                time.sleep(0.3)
        ready_s = time.perf_counter() - started
        body = json.dumps({"inputs": images[:64].tolist()}).encode()
        latencies = []
        for i in range(requests + 5):
            request = urllib.request.Request(
                f"{url}/invocations", data=body, headers={"Content-Type": "application/json"}
            )
            t = time.perf_counter()
            with urllib.request.urlopen(request, timeout=60) as response:
                assert len(json.loads(response.read())["predictions"]) == 64
            if i >= 5:  # the first requests warm up the server
                latencies.append(1000 * (time.perf_counter() - t))
        latencies.sort()
        return {
            "ready_s": ready_s,
            "requests": len(latencies),
            "images_per_request": 64,
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "mean_ms": statistics.fmean(latencies),
        }
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.path.join(REPO, "..", "shared", "datasets", "fashion-mnist"))
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args()

    from flows.prefect_server import ensure_prefect
    from tasks.domain.home import HOME_ENV_VAR, PipelineHome
    from tasks.domain.image_source import read_images

    work = tempfile.mkdtemp(prefix="trainlib_model_bench_")
    os.environ[HOME_ENV_VAR] = work
    home = PipelineHome.resolve()
    server = ensure_prefect(home, port=_free_port())
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
    tracking_uri = f"sqlite:///{os.path.join(work, 'mlflow.db')}"
    input_url = os.path.join(os.path.abspath(args.mirror), "t10k-images-idx3-ubyte.gz")
    images = read_images(input_url).pixels

    load_before = os.getloadavg()
    result: dict = {
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": load_before,
            "note": "shared machine: other sessions ran tests meanwhile",
        },
        "errors": {},
    }
    os.makedirs(args.out, exist_ok=True)

    def stage(name: str, func):
        """Run one measurement; keep its figures, or its error, and write what there is so far."""
        try:
            result[name] = func()
            print(json.dumps({name: result[name]}), flush=True)
        except Exception as exc:  # noqa: BLE001 - a failed stage is reported, the others still run
            result["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"{name} failed: {result['errors'][name]}", flush=True)
        result["machine"]["load_avg_after"] = os.getloadavg()
        with open(os.path.join(args.out, "model.json"), "w") as f:
            json.dump(result, f, indent=1)

    try:
        result["model_version"] = register(tracking_uri, os.path.abspath(args.mirror))
        stage("pyfunc", lambda: bench_pyfunc(tracking_uri, images))
        stage("scoring_1_worker", lambda: bench_scoring(tracking_uri, input_url, work, 1))
        stage("scoring_2_workers", lambda: bench_scoring(tracking_uri, input_url, work, 2))
        if "scoring_1_worker" in result and "scoring_2_workers" in result:
            result["scoring_speedup_2_vs_1"] = (
                result["scoring_2_workers"]["images_per_s"] / result["scoring_1_worker"]["images_per_s"]
            )
        stage("serving", lambda: bench_serving(tracking_uri, images, args.requests, os.path.join(work, "serve.log")))
        _write_markdown(result, args.out)
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGTERM)  # the Prefect server this benchmark started


def _write_markdown(result: dict, out: str) -> None:
    machine = result["machine"]
    missing = "not measured (see errors)"
    p, s = result.get("pyfunc"), result.get("serving")
    one, two = result.get("scoring_1_worker"), result.get("scoring_2_workers")
    lines = [
        f"Registered model benchmark on the 10,000 real FashionMNIST test images ({machine['cores']} cores; load "
        f"average before/after {machine['load_avg_before'][0]:.1f} / {machine['load_avg_after'][0]:.1f}: a shared "
        "machine, so these are lower bounds).",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        "| in-process pyfunc predict | "
        + (f"{p['images_per_s']:.0f} images/s ({p['torch_threads']} torch threads)" if p else missing)
        + " | |",
        "| in-process pyfunc, 64-image call, p50 | " + (f"{p['call_64_p50_ms']:.0f} ms" if p else missing) + " | |",
        "| batch scoring, 1 Ray worker (scoring stage) | "
        + (f"{one['images_per_s']:.0f} images/s (whole flow run {one['flow_wall_s']:.0f} s)" if one else missing)
        + " | |",
        "| batch scoring, 2 Ray workers (scoring stage) | "
        + (f"{two['images_per_s']:.0f} images/s (whole flow run {two['flow_wall_s']:.0f} s)" if two else missing)
        + " | |",
        "| 2 workers vs 1 | "
        + (f"{result['scoring_speedup_2_vs_1']:.2f}x" if one and two else missing)
        + " | >= 1.6x |",
        "| served 64-image request, p50 | " + (f"{s['p50_ms']:.0f} ms" if s else missing) + " | < 150 ms |",
        "| served 64-image request, p99 | " + (f"{s['p99_ms']:.0f} ms" if s else missing) + " | |",
    ]
    for name, error in result["errors"].items():
        lines.append(f"\n{name} failed: `{error}`")
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
