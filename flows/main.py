"""One command for the whole pipeline on one machine: ``python -m flows.main`` (or ``trainlib-pipeline``).

Runs in the user's shell. It starts what is missing: a Prefect server on
127.0.0.1 with SQLite (unless ``PREFECT_API_URL`` is set or a server already
answers on the chosen port; it is left running for its UI), MLflow's SQLite
store, and a local Ray (started by the flow). Then it runs the pipeline, whose
steps log their progress to this console, and prints where to look.

FashionMNIST comes from the internet by default. Offline, name a mirror::

    python -m flows.main --mirror ../shared/datasets/fashion-mnist --epochs 1
    TRAINLIB_DATA_MIRRORS=/data/fashion-mnist python -m flows.main
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_HOME = "~/.trainlib"
DEFAULT_PREFECT_PORT = 4200
SERVER_START_TIMEOUT_S = 90.0
MIRRORS_ENV_VAR = "TRAINLIB_DATA_MIRRORS"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trainlib-pipeline",
        description="Download FashionMNIST, train ResNet18 with trainlib on Ray, evaluate, register in MLflow.",
        epilog=f"FashionMNIST is downloaded from the internet unless --mirror or {MIRRORS_ENV_VAR} names a mirror "
               "(a folder holding the four .gz files, or an http(s)://, s3:// URL).")
    parser.add_argument("--mirror", action="append", default=None, metavar="URL_OR_FOLDER",
                        help=f"where to fetch the data set (repeat for fallbacks; default: ${MIRRORS_ENV_VAR}, "
                             "else the official internet mirrors)")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128, help="per worker")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--limit", type=int, default=None, help="train on the first N training images only")
    parser.add_argument("--test-limit", type=int, default=None, help="evaluate on the first N test images only")
    parser.add_argument("--home", default=DEFAULT_HOME,
                        help="where the embedded services keep their state (default: %(default)s)")
    parser.add_argument("--storage-path", default=None, help="trainlib run storage (default: HOME/runs)")
    parser.add_argument("--mlflow-tracking-uri", default=None,
                        help="default: $MLFLOW_TRACKING_URI, else sqlite:///HOME/mlflow.db")
    parser.add_argument("--model-name", default="fashion-mnist-resnet18")
    parser.add_argument("--ray-address", default=None, help="a Ray cluster (default: a local Ray for this run)")
    parser.add_argument("--prefect-port", type=int, default=DEFAULT_PREFECT_PORT)
    return parser.parse_args(argv)


def server_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """Whether a Prefect server answers at ``api_url`` (``.../api``)."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_prefect_server(home: str, port: int) -> tuple[str, int]:
    """Start ``prefect server start`` on 127.0.0.1 with SQLite in ``home/prefect``; return (API URL, pid).

    Raises:
        RuntimeError: it did not become healthy in time; the message points at its log.
    """
    prefect_home = os.path.join(home, "prefect")
    os.makedirs(prefect_home, exist_ok=True)
    log_path = os.path.join(home, "prefect-server.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=prefect_home, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="true")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    api_url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server_healthy(api_url):
            return api_url, process.pid
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"The Prefect server on 127.0.0.1:{port} did not become healthy within "
                       f"{SERVER_START_TIMEOUT_S:.0f} s; see {log_path}. Is the port taken? Pass --prefect-port.")


def ensure_prefect(home: str, port: int) -> tuple[str, str]:
    """The Prefect API to use and how it was found: PREFECT_API_URL, a running server, or a new one."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        if not server_healthy(url, timeout_s=5.0):
            raise RuntimeError(f"PREFECT_API_URL={url} does not answer ({url.rstrip('/')}/health). Start that "
                               "server, or unset PREFECT_API_URL to let this command start one on 127.0.0.1.")
        return url, "from PREFECT_API_URL"
    local = f"http://127.0.0.1:{port}/api"
    if server_healthy(local):
        return local, f"already running on 127.0.0.1:{port}"
    url, pid = start_prefect_server(home, port)
    return url, f"started (pid {pid}, state in {home}/prefect; stop it with `kill {pid}`)"


def mlflow_tracking_uri(tracking_uri: str | None, home: str) -> str:
    """The tracking URI: the option, else ``MLFLOW_TRACKING_URI``, else a SQLite store in ``home``.

    trainlib.mlflow keeps a SQLite store's artifacts next to the database (``home/mlartifacts``).
    """
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(home, 'mlflow.db')}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    home = os.path.abspath(os.path.expanduser(args.home))
    os.makedirs(home, exist_ok=True)
    mirrors = args.mirror or [m for m in os.environ.get(MIRRORS_ENV_VAR, "").split(",") if m.strip()] or None
    if mirrors:
        mirrors = [m if "://" in m else os.path.abspath(os.path.expanduser(m)) for m in mirrors]
    print(f"Data: {args.dataset} from " + (", ".join(mirrors) if mirrors else
                                            f"the official internet mirrors (offline? pass --mirror FOLDER or set "
                                            f"{MIRRORS_ENV_VAR})"), flush=True)

    api_url, how = ensure_prefect(home, args.prefect_port)
    # Set before Prefect is imported, so this process and the Ray workers use this server.
    os.environ["PREFECT_API_URL"] = api_url
    os.environ.setdefault("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "false")
    print(f"Prefect server: {api_url} ({how})", flush=True)
    experiment = "fashion-mnist"
    tracking_uri = mlflow_tracking_uri(args.mlflow_tracking_uri, home)
    storage_path = args.storage_path or os.path.join(home, "runs")

    from flows.pipeline import training_pipeline

    state = training_pipeline(
        dataset=args.dataset, mirrors=mirrors, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
        num_workers=args.num_workers, use_gpu=args.use_gpu, storage_path=storage_path, limit=args.limit,
        test_limit=args.test_limit, data_cache_dir=os.path.join(home, "datasets"), mlflow_tracking_uri=tracking_uri,
        experiment_name=experiment, model_name=args.model_name, ray_address=args.ray_address, return_state=True)
    ui = api_url[: -len("/api")] if api_url.endswith("/api") else api_url
    flow_run_id = state.state_details.flow_run_id
    print("\nWhere to look:")
    print(f"  Prefect UI:  {ui}/runs/flow-run/{flow_run_id}")
    if tracking_uri.startswith("sqlite:///"):
        print(f"  MLflow UI:   mlflow ui --backend-store-uri {tracking_uri}  (then http://127.0.0.1:5000)")
    else:
        print(f"  MLflow:      {tracking_uri}")
    print(f"  Run storage: {storage_path}")
    if not state.is_completed():
        print(f"\nThe pipeline ended {state.name}: {state.message}", file=sys.stderr)
        return 1
    summary: dict[str, Any] = state.result()
    print(f"\nTest accuracy {summary['test_accuracy']:.2%}; {summary['model_name']} version {summary['model_version']}: "
          f"{summary['decision']}")
    print("Seconds per stage: " + json.dumps({k: round(v, 1) for k, v in summary["stage_seconds"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
