"""Rollback: move ``champion`` back to an earlier registered version, recording who did it and why.

Runs wherever ``python -m flows.rollback`` runs (a person's shell, a CI job). No Prefect here. The
next pipeline run scores the champion the alias names, so it compares its challenger with the
restored version; nothing else has to change.

What is recorded (every entry names the person, the time in UTC and the reason):

* on the restored version: ``rollback.restored`` (and ``rollback.replaced_version``);
* on the version it replaces: ``rollback.demoted``;
* on the registered model: ``rollback.<UTC time>``, one tag per rollback, so the history stays readable
  in the MLflow UI's model page.

Example::

    record = rollback_champion(tracking_uri, "fashion-mnist-resnet18", "3", reason="class 6 collapsed", by="ana")
    record.sentence()  # "champion of fashion-mnist-resnet18: version 5 -> 3 by ana at ...: class 6 collapsed"
"""

from __future__ import annotations

import dataclasses
import datetime

from tasks.domain.promotion import CHAMPION_ALIAS

TAG_PREFIX = "rollback."


class RollbackError(ValueError):
    """A rollback that cannot be done: the message names the option, the value and the fix."""


@dataclasses.dataclass(frozen=True)
class Rollback:
    """One rollback, as recorded.

    Attributes:
        model_name: the registered model.
        from_version: the champion before (None: there was none).
        to_version: the champion now.
        by: who asked for it.
        reason: why.
        at: when, ISO 8601 in UTC.
    """

    model_name: str
    from_version: str | None
    to_version: str
    by: str
    reason: str
    at: str

    def sentence(self) -> str:
        """One line for logs, tags and the terminal."""
        return (
            f"champion of {self.model_name}: version {self.from_version or 'none'} -> {self.to_version} "
            f"by {self.by} at {self.at}: {self.reason}"
        )


def rollback_champion(tracking_uri: str, model_name: str, to_version: str, reason: str, by: str) -> Rollback:
    """Point ``champion`` of ``model_name`` at ``to_version`` and record the rollback (see the module docstring).

    Raises:
        RollbackError: an empty reason or name, no such model or version (the message lists the versions),
            or ``to_version`` already the champion.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.domain.champion import champion_version

    if not reason.strip():
        raise RollbackError("--reason is empty: say why the champion goes back, e.g. --reason 'class Shirt collapsed'.")
    if not by.strip():
        raise RollbackError("--by is empty: name who rolls back (default: the OS user).")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        versions = sorted((str(v.version) for v in client.search_model_versions(f"name = '{model_name}'")), key=int)
    except MlflowException as exc:
        raise RollbackError(f"--model {model_name!r}: cannot list its versions in {tracking_uri}: {exc}") from None
    if not versions:
        raise RollbackError(
            f"--model {model_name!r} has no registered versions in {tracking_uri}: check the name and "
            "MLFLOW_TRACKING_URI / --tracking-uri."
        )
    if str(to_version) not in versions:
        raise RollbackError(
            f"--to-version {to_version!r}: {model_name} has no such version; registered versions: "
            f"{', '.join(versions)}."
        )
    current = champion_version(client, model_name)
    if current == str(to_version):
        raise RollbackError(f"--to-version {to_version}: it is the champion of {model_name} already: nothing to do.")
    record = Rollback(
        model_name=model_name,
        from_version=current,
        to_version=str(to_version),
        by=by.strip(),
        reason=reason.strip(),
        at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    sentence = record.sentence()
    client.set_registered_model_alias(model_name, CHAMPION_ALIAS, record.to_version)
    client.set_model_version_tag(model_name, record.to_version, f"{TAG_PREFIX}restored", sentence)
    client.set_model_version_tag(model_name, record.to_version, f"{TAG_PREFIX}replaced_version", current or "none")
    if current is not None:
        client.set_model_version_tag(model_name, current, f"{TAG_PREFIX}demoted", sentence)
    client.set_registered_model_tag(model_name, f"{TAG_PREFIX}{record.at}", sentence)
    return record
