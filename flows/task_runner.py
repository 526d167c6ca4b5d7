"""The flow's task runner: prefect-ray's RayTaskRunner on a local Ray or a cluster. Runs in the flow-run process.

Every task runs on a Ray worker whose environment carries this flow's ``PREFECT_API_URL`` (and
nothing secret), so all task runs land in the same Prefect server; ephemeral servers are
switched off there, and trainlib's log records reach the task run logs.
"""

from __future__ import annotations

from typing import Any

from prefect.settings import get_current_settings
from prefect_ray import RayTaskRunner


class PrefectAPIMissingError(RuntimeError):
    """The flow runs without a Prefect API URL, so Ray workers could not report their task runs."""


def ray_worker_env(api_url: str) -> dict[str, str]:
    """Environment for every Ray worker: where the Prefect API is, never an ephemeral server, trainlib's logs.

    Only the URL travels; an API key would be a secret, so Prefect Cloud users set it on the
    cluster nodes themselves.
    """
    return {"PREFECT_API_URL": api_url, "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false",
            "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib"}


def make_task_runner(ray_address: str | None, api_url: str) -> RayTaskRunner:
    """A RayTaskRunner for a local Ray (``ray_address`` None) or the cluster at ``ray_address``."""
    init_kwargs: dict[str, Any] = {"runtime_env": {"env_vars": ray_worker_env(api_url)}}
    if not ray_address:
        init_kwargs["include_dashboard"] = False  # a second of start-up the embedded run does not need
    # "local" starts a new Ray; None would join the last cluster started on this machine.
    return RayTaskRunner(address=ray_address or "local", init_kwargs=init_kwargs)


def current_api_url() -> str:
    """This process's Prefect API URL.

    Raises:
        PrefectAPIMissingError: none is set (the flow runs on a temporary in-process server,
            which Ray workers could not reach).
    """
    url = get_current_settings().api.url
    if not url:
        raise PrefectAPIMissingError(
            "PREFECT_API_URL is not set, so the Ray workers would have no Prefect server to report task runs "
            "to. Start one (prefect server start --host 127.0.0.1) and set PREFECT_API_URL="
            "http://127.0.0.1:4200/api, or run the pipeline with `python -m flows.main`, which does both.")
    return url
