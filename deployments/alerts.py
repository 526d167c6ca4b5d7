"""Alerts for the pipeline: a Prefect automation that notifies when a pipeline run fails or crashes.

Runs once, from an admin's shell, against the Prefect server the deployment uses::

    python -m deployments.alerts --webhook-url https://hooks.example.com/...   # a generic JSON webhook
    python -m deployments.alerts --block slack-webhook/team-ml                 # any notification block
    TRAINLIB_ALERT_WEBHOOK_URL=... python -m deployments.alerts

It saves (or replaces) a notification block and one automation: on the events
``prefect.flow-run.Failed``, ``Crashed`` or ``TimedOut`` of the ``training-pipeline`` flow,
Prefect's server sends the flow run's name, state, message and UI link through the block. The
webhook URL is a secret: it lives in the Prefect server's block store, never in this repository.
Slack and e-mail wiring: see docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import uuid

from deployments import FLOW_NAME

WEBHOOK_ENV_VAR = "TRAINLIB_ALERT_WEBHOOK_URL"
BLOCK_NAME = "trainlib-pipeline-alerts"
AUTOMATION_NAME = "trainlib: pipeline run failed"
ALERT_STATES = ("Failed", "Crashed", "TimedOut")
SUBJECT = "trainlib pipeline: flow run {{ flow_run.name }} {{ flow_run.state.name }}"
BODY = (
    "Flow run {{ flow_run.name }} of flow {{ flow.name }} entered state {{ flow_run.state.name }}.\n"
    "Message: {{ flow_run.state.message }}\n"
    "Flow run id: {{ flow_run.id }}\n"
    "{{ flow_run|ui_url }}"
)


@dataclasses.dataclass(frozen=True)
class AlertSetup:
    """What :func:`configure_alerts` saved: the notification block and the automation."""

    block_document_id: uuid.UUID
    automation_id: uuid.UUID


def save_webhook_block(url: str, allow_private_urls: bool = False, name: str = BLOCK_NAME) -> uuid.UUID:
    """Save a generic JSON webhook notification block posting ``{"subject", "body"}`` to ``url``; return its id.

    ``allow_private_urls`` lets the server post to a private or loopback address (an intranet
    relay, or a test's receiver); Prefect refuses those by default.
    """
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name="trainlib alerts",
        url=url,
        method="POST",
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        allow_private_urls=allow_private_urls,
    )
    return block.save(name, overwrite=True)


def block_document_id(slug: str) -> uuid.UUID:
    """The id of a saved notification block named ``<block type>/<name>``, e.g. ``slack-webhook/team-ml``.

    Raises:
        ValueError: the block does not exist; the message says how to make one.
    """
    from prefect.blocks.core import Block

    try:
        return Block.load(slug)._block_document_id
    except ValueError as exc:
        raise ValueError(
            f"No notification block {slug!r} on this Prefect server ({exc}). Create one in the UI "
            "(Blocks -> +, e.g. 'Slack Webhook') or with Python, then pass its '<type>/<name>'."
        ) from None


def configure_alerts(block_id: uuid.UUID, flow_name: str = FLOW_NAME) -> AlertSetup:
    """Create (or replace) the automation that notifies through block ``block_id`` when a run of ``flow_name`` fails."""
    from prefect.automations import Automation
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import EventTrigger, Posture

    try:
        Automation.read(name=AUTOMATION_NAME).delete()
    except ValueError:
        pass  # none yet
    automation = Automation(
        name=AUTOMATION_NAME,
        description=f"Notify when a run of the {flow_name!r} flow fails, crashes or times out.",
        trigger=EventTrigger(
            expect={f"prefect.flow-run.{state}" for state in ALERT_STATES},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": flow_name},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    ).create()
    return AlertSetup(block_document_id=block_id, automation_id=automation.id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.alerts", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--webhook-url",
        default=None,
        help=f"a URL receiving JSON {{subject, body}} posts (default: ${WEBHOOK_ENV_VAR})",
    )
    where.add_argument("--block", default=None, help="an existing notification block, '<type>/<name>'")
    parser.add_argument(
        "--allow-private-urls", action="store_true", help="let the server post to a private or loopback address"
    )
    args = parser.parse_args(argv)
    url = args.webhook_url or os.environ.get(WEBHOOK_ENV_VAR)
    if args.block:
        block_id = block_document_id(args.block)
    elif url:
        block_id = save_webhook_block(url, args.allow_private_urls)
    else:
        parser.error(f"name where alerts go: --webhook-url URL, --block TYPE/NAME or ${WEBHOOK_ENV_VAR}")
    setup = configure_alerts(block_id)
    print(
        f"Automation {AUTOMATION_NAME!r} ({setup.automation_id}) notifies through block {setup.block_document_id} "
        f"when a {FLOW_NAME!r} run is {', '.join(ALERT_STATES)}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
