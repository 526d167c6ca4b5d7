"""One command for the whole pipeline on one machine: ``python -m flows.main`` (or ``trainlib-pipeline``).

Runs in the user's shell. Its options are derived from :class:`flows.params.PipelineParams`
(same names, help and defaults as the deployment's parameters) and checked before anything
starts. Then it starts what is missing: a Prefect server on 127.0.0.1 with SQLite (unless
``PREFECT_API_URL`` is set or a server already answers on the chosen port; it is left
running for its UI); the flow starts a local Ray and uses MLflow's SQLite store in the
pipeline's home (``$TRAINLIB_HOME``, default ``~/.trainlib``), the same home a deployment
run resolves. Then it runs the pipeline and prints where to look.

FashionMNIST comes from the internet by default. Offline, name a mirror::

    python -m flows.main --mirrors ../shared/datasets/fashion-mnist --epochs 1
    TRAINLIB_DATA_MIRRORS=/data/fashion-mnist python -m flows.main
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import gc
import json
import os
import sys
import typing
from typing import Any

from flows.lifeline import Lifeline
from flows.params import PipelineParams, PipelineParamsError, option_name
from flows.prefect_server import DEFAULT_PREFECT_PORT, ensure_prefect
from flows.preflight import check_services
from tasks.domain.credentials import move_credentials_to_environment
from tasks.domain.data_source import is_builtin
from tasks.domain.home import DEFAULT_HOME, HOME_ENV_VAR, PipelineHome
from tasks.domain.mirror_fetch import MIRRORS_ENV_VAR
from tasks.domain.urls import expand_path, mask_url
from tasks.domain.writable import folder_write_error
from trainlib.errors import TrainlibError

PROG = "trainlib-pipeline"
NULL_WORDS = ("none", "null")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        # argparse says "unrecognized arguments"; say which option was meant and where the list is.
        if message.startswith("unrecognized arguments:"):
            known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("-"):
                    close = difflib.get_close_matches(word.split("=")[0], known, n=1)
                    hints.append(f"unknown option {word}" + (f": did you mean {close[0]}?" if close else ""))
            message = "; ".join(hints) or message
        self.exit(2, f"{self.prog}: error: {message}\nSee `{self.prog} --help` for every option.\n")


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(a) is list for a in (annotation, *typing.get_args(annotation)))


def _is_bool(annotation: Any) -> bool:
    return annotation is bool


def build_parser() -> argparse.ArgumentParser:
    """The command line: one option per field of :class:`PipelineParams`, plus where the services live."""
    parser = _Parser(
        prog=PROG,
        description="Download FashionMNIST, train ResNet18 with trainlib on Ray, evaluate, register in MLflow.",
        epilog=f"FashionMNIST is downloaded from the internet unless --mirrors or {MIRRORS_ENV_VAR} names a mirror "
        "(a folder holding the four .gz files, or an http(s)://, s3:// URL). Options of optional values "
        "take 'none' to unset them.",
        allow_abbrev=False,
    )
    for name, field in PipelineParams.model_fields.items():
        default = field.default
        help_text = f"{field.description} (default: {default})" if default is not None else field.description
        if _is_bool(field.annotation):
            parser.add_argument(
                option_name(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif _is_list(field.annotation):
            parser.add_argument(
                option_name(name),
                dest=name,
                action="append",
                default=None,
                metavar="VALUE",
                help=help_text + " Repeat for several.",
            )
        else:
            # Strings go to pydantic as they are: one validator, one kind of message for every bad value.
            parser.add_argument(option_name(name), dest=name, default=None, metavar=name.upper(), help=help_text)
    services = parser.add_argument_group("where the embedded services keep their state")
    services.add_argument(
        "--home",
        default=None,
        help=f"the pipeline's home: run storage, data cache, MLflow store, Prefect server "
        f"(default: ${HOME_ENV_VAR}, else {DEFAULT_HOME})",
    )
    services.add_argument(
        "--prefect-port",
        type=int,
        default=DEFAULT_PREFECT_PORT,
        help="port of the Prefect server to use or start on 127.0.0.1 (default: %(default)s)",
    )
    return parser


def parse_params(argv: list[str] | None = None) -> tuple[PipelineParams, argparse.Namespace]:
    """Parse and validate the command line; exit with status 2 and one clear message on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for name, field in PipelineParams.model_fields.items():
        value = getattr(args, name)
        if value is None:
            continue
        optional = type(None) in typing.get_args(field.annotation)
        if optional and isinstance(value, str) and value.lower() in NULL_WORDS:
            value = None
        values[name] = value
    if values.get("mirrors"):
        values["mirrors"] = [expand_path(m) for m in values["mirrors"]]
    # Before the flow run exists: its parameters (stored by Prefect in clear) never hold credentials.
    for note in move_credentials_to_environment(values):
        print(note, flush=True)
    try:
        return PipelineParams.parse(values, as_options=True), args
    except PipelineParamsError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")


def home_problem(root: str) -> str | None:
    """Why the pipeline's home ``root`` cannot be used (made, then written: a probe file), or None."""
    exc = folder_write_error(root)
    if exc is None:
        return None
    return (
        f"the pipeline's home {root} cannot be written ({type(exc).__name__}: {exc.strerror or exc}). Pass "
        f"--home with a writable folder, or set ${HOME_ENV_VAR} to one."
    )


def main(argv: list[str] | None = None) -> int:
    params, args = parse_params(argv)
    if args.home:
        os.environ[HOME_ENV_VAR] = expand_path(args.home)  # the flow resolves the same home from it
    home = PipelineHome.resolve()
    problem = home_problem(home.root)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    mirrors = params.mirrors or [m for m in os.environ.get(MIRRORS_ENV_VAR, "").split(",") if m.strip()]
    if params.data and not is_builtin(params.data):
        print(f"Data: your images at {mask_url(params.source)} (snapshot and validation before training)", flush=True)
    else:
        print(
            f"Data: {params.source} from "
            + (
                ", ".join(map(mask_url, mirrors))
                if mirrors
                else f"the official internet mirrors (offline? pass --mirrors FOLDER or set {MIRRORS_ENV_VAR})"
            ),
            flush=True,
        )

    # Unreachable services fail here, in seconds, before a server starts or data is fetched.
    try:
        check_services(params.ray_address, params.mlflow_tracking_uri or home.mlflow_tracking_uri)
    except TrainlibError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    server = ensure_prefect(home, args.prefect_port)
    # Set before Prefect is imported, so this process and the Ray workers use this server.
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ.setdefault("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "false")
    print(f"Prefect server: {server.api_url} ({server.how})", flush=True)

    from flows.pipeline import training_pipeline
    from flows.pipeline_run import resolve_run
    from flows.summary import PipelineSummary

    with Lifeline(server.api_url):  # prompt stop on Ctrl-C / SIGTERM, or when the Prefect API is gone
        state = training_pipeline(params, return_state=True)
    flow_run_id = str(state.state_details.flow_run_id)
    run = resolve_run(params, flow_run_id, home)
    print("\nWhere to look:")
    print(f"  Prefect UI:  {server.ui_url}/runs/flow-run/{flow_run_id}")
    if run.mlflow_tracking_uri.startswith("sqlite:///"):
        print(f"  MLflow UI:   mlflow ui --backend-store-uri {run.mlflow_tracking_uri}  (then http://127.0.0.1:5000)")
    else:
        print(f"  MLflow:      {mask_url(run.mlflow_tracking_uri)}")
    print(f"  Run storage: {mask_url(run.training.storage_path)}/{run.training.run_name}")
    if not state.is_completed():
        print(f"\nThe pipeline ended {state.name}: {state.message}", file=sys.stderr)
        return 1
    summary = state.result()
    if not isinstance(summary, PipelineSummary):  # a skipped run: nothing new since the champion's data
        print(f"\n{state.message}")
        return 0
    print(
        f"\nTest accuracy {summary.test_accuracy:.2%}; {summary.model_name} version {summary.model_version}: "
        f"{summary.decision}"
    )
    print("Seconds per stage: " + json.dumps({k: round(v, 1) for k, v in summary.stage_times.seconds().items()}))
    return 0


if __name__ == "__main__":
    # This command's own process. At exit, Python's final garbage collection walks every object of torch, Ray,
    # Prefect and mlflow: most of the time from the last line to the exit (docs/benchmarks.md, "The pipeline (kept)").
    # What the pipeline keeps is flushed and closed before (its states, MLflow's runs, the logs), so the
    # objects left need no collection; registered first, the freeze runs after every other exit hook.
    atexit.register(gc.freeze)
    sys.exit(main())
